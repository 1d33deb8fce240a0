#pragma once

#include <ATen/mps/MPSOnceCache.h>
#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace at::mps {

// Note [MPS graph and kernel caches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Apple forbids encoding one MPSKernel from two threads at once (MPSGraph is
// undocumented), and streams on different threads can reach one cached
// object together. So MPSGraphCache and MPSKernelCache keep one object per
// key, created once (Note [MPS create-once cache]), with an encode lock that
// every encode of it holds: one object's encodes serialise, different
// objects' run in parallel (per-thread caches would build, compile and keep
// every graph per thread). Entries are also indexed by object address, as
// encoders usually hold only the raw object (runMPSGraph gets an MPSGraph*);
// an object not from the cache gets a no-op guard. EncodeGuard is re-entrant
// per thread, so two layers of the encoding path may both guard one encode.
//
// Lock order: a graph's encode lock before its stream's serial section
// (runMPSGraph); a kernel's inside it, after any family lock
// (Note [MPS Apple framework workarounds]). Under an encode lock only the
// stream's own locks (serial section, command-buffer lifecycle, encoder
// gate) are taken, never another encode lock or a family lock.
struct EncodeLock {
  Mutex mu;
  // Written only by the holder: a relaxed load sees our id iff we hold it.
  std::atomic<std::thread::id> holder{};
};

// Holds `lock` unless null or held by this thread (beyond the analysis).
class EncodeGuard {
 public:
  explicit EncodeGuard(EncodeLock* lock) MPS_NO_THREAD_SAFETY_ANALYSIS {
    if (lock == nullptr ||
        lock->holder.load(std::memory_order_relaxed) ==
            std::this_thread::get_id()) {
      return;
    }
    lock->mu.lock();
    lock->holder.store(std::this_thread::get_id(), std::memory_order_relaxed);
    lock_ = lock;
  }
  ~EncodeGuard() MPS_NO_THREAD_SAFETY_ANALYSIS {
    if (lock_ != nullptr) {
      lock_->holder.store(std::thread::id(), std::memory_order_relaxed);
      lock_->mu.unlock();
    }
  }
  EncodeGuard(const EncodeGuard&) = delete;
  EncodeGuard& operator=(const EncodeGuard&) = delete;

 private:
  EncodeLock* lock_ = nullptr;
};

template <typename T>
class ObjectCache {
 public:
  using IdentityFn = const void* (*)(const T&);

  class Entry {
   public:
    Entry(std::string key, std::unique_ptr<T> object)
        : key_(std::move(key)), object_(std::move(object)) {}
    T* object() const {
      return object_.get();
    }
    const std::string& key() const {
      return key_;
    }

   private:
    friend class ObjectCache;
    const std::string key_;
    const std::unique_ptr<T> object_;
    mutable EncodeLock encode_lock_;
  };

  explicit ObjectCache(IdentityFn identity) : identity_(identity) {}

  // create() returns a non-null std::unique_ptr<T>.
  template <typename Create>
  Entry& getOrCreate(const std::string& key, Create&& create) {
    return *entries_.getOrCreate(key, [&]() {
      auto entry = std::make_unique<Entry>(key, std::forward<Create>(create)());
      TORCH_CHECK(
          entry->object() != nullptr,
          "MPS object cache: creating the object for key '",
          key,
          "' returned null");
      Entry* const raw = entry.get();
      Entry* const indexed = by_identity_.getOrCreate(
          identity_(*raw->object()), [raw]() { return raw; });
      TORCH_INTERNAL_ASSERT(
          indexed == raw,
          "MPS object cache: two entries hold the same object (key '",
          key,
          "')");
      return entry;
    });
  }

  Entry* find(const std::string& key) const {
    const std::unique_ptr<Entry>* entry = entries_.find(key);
    return entry != nullptr ? entry->get() : nullptr;
  }

  Entry* findByIdentity(const void* identity) const {
    Entry* const* entry = by_identity_.find(identity);
    return entry != nullptr ? *entry : nullptr;
  }

  EncodeGuard encodeGuard(const void* identity) const {
    Entry* entry = findByIdentity(identity);
    return EncodeGuard(entry != nullptr ? &entry->encode_lock_ : nullptr);
  }

 private:
  const IdentityFn identity_;
  OnceCache<std::string, std::unique_ptr<Entry>> entries_;
  OnceCache<const void*, Entry*> by_identity_;
};

} // namespace at::mps
