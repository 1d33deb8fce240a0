#pragma once

// The process-wide cache policy of MPSGraphCache and MPSKernelCache: one
// shared object per key, created once, and an encode lock per entry so that
// no cached object is ever encoded by two threads at the same time.

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
// Apple documents that one MPSKernel must never be encoded from two threads
// at once (copy it per thread instead), and says nothing about MPSGraph; with
// a stream per thread, two streams can reach the same cached object at the
// same moment. The caches therefore keep:
//  - one shared object per key, created once with the guarantees of
//    Note [MPS create-once cache] (no lock held while a graph is built, a
//    concurrent requester of the key waits for it, no duplicate is built);
//  - an EncodeLock per entry. Every encode of a cached object holds an
//    EncodeGuard on its entry, so encodes of one object are serialised while
//    encodes of different objects run in parallel.
// The alternative, per-thread caches, would build and compile every graph
// once per thread and keep one copy per thread alive; see
// reports/op-thread-safety.md for the costs behind this choice.
//
// Encoding code usually holds only the raw object (upstream passes an
// MPSGraph* to runMPSGraph), so entries are also indexed by the identity of
// their object (its address), and encodeGuard(identity) finds the lock. An
// object that did not come from the cache gets a guard that locks nothing.
//
// EncodeGuard is re-entrant per thread: a thread that already holds an
// entry's lock (an outer layer guarded the same encode) takes it again for
// free, so two layers of the encoding path may both guard without
// deadlocking.
//
// Lock order: the encode lock of a graph is taken before its stream's serial
// section is entered (runMPSGraph), the encode lock of a kernel inside it
// (after any kernel-family lock, see Note [MPS Apple framework workarounds]).
// While an encode lock is held, only the stream's own locks are acquired
// (its serial section, its command-buffer lifecycle, the encoder gate), never
// another encode lock or a family lock. Entries live as long as the cache
// (no eviction, see Note [MPS create-once cache]).

class EncodeGuard;

// The per-entry lock of Note [MPS graph and kernel caches].
class EncodeLock {
 public:
  EncodeLock() = default;
  EncodeLock(const EncodeLock&) = delete;
  EncodeLock& operator=(const EncodeLock&) = delete;

 private:
  friend class EncodeGuard;
  Mutex mu_;
  // The thread holding mu_, or a default id. Only the holder writes its own
  // id, so a relaxed load reads the caller's own id iff it is the holder.
  std::atomic<std::thread::id> holder_{};
};

// Holds an EncodeLock for its scope; see Note [MPS graph and kernel caches].
// A null lock, or one the calling thread already holds, is not taken again.
class EncodeGuard {
 public:
  // Conditional acquisition (null or already held) is beyond the analysis.
  explicit EncodeGuard(EncodeLock* lock) MPS_NO_THREAD_SAFETY_ANALYSIS {
    if (lock == nullptr ||
        lock->holder_.load(std::memory_order_relaxed) ==
            std::this_thread::get_id()) {
      return;
    }
    lock->mu_.lock();
    lock->holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    lock_ = lock;
  }
  // Releases what the constructor took, which the analysis cannot see.
  ~EncodeGuard() MPS_NO_THREAD_SAFETY_ANALYSIS {
    if (lock_ != nullptr) {
      lock_->holder_.store(std::thread::id(), std::memory_order_relaxed);
      lock_->mu_.unlock();
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
  // The identity of a cached object: the address encoders pass around.
  using IdentityFn = const void* (*)(const T&);

  class Entry {
   public:
    Entry(std::string key, std::unique_ptr<T> object)
        : key_(std::move(key)), object_(std::move(object)) {}
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

    T* object() const {
      return object_.get();
    }
    const std::string& key() const {
      return key_;
    }
    EncodeLock& encodeLock() const {
      return encode_lock_;
    }

   private:
    const std::string key_;
    const std::unique_ptr<T> object_;
    mutable EncodeLock encode_lock_;
  };

  explicit ObjectCache(IdentityFn identity) : identity_(identity) {}
  ObjectCache(const ObjectCache&) = delete;
  ObjectCache& operator=(const ObjectCache&) = delete;

  // The entry for `key`; create() returns a std::unique_ptr<T> (non-null).
  template <typename Create>
  Entry& getOrCreate(const std::string& key, Create&& create) {
    return *entries_.getOrCreate(key, [&]() {
      std::unique_ptr<T> object = std::forward<Create>(create)();
      TORCH_CHECK(
          object != nullptr,
          "MPS object cache: creating the object for key '",
          key,
          "' returned null");
      auto entry = std::make_unique<Entry>(key, std::move(object));
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

  // The entry for `key` if it has been created; never waits.
  Entry* find(const std::string& key) const {
    const std::unique_ptr<Entry>* entry = entries_.find(key);
    return entry != nullptr ? entry->get() : nullptr;
  }

  // The entry whose object has `identity`, or nullptr.
  Entry* findByIdentity(const void* identity) const {
    Entry* const* entry = by_identity_.find(identity);
    return entry != nullptr ? *entry : nullptr;
  }

  // The guard every encode of the object `identity` holds; it locks nothing
  // for objects that are not in this cache.
  EncodeGuard encodeGuard(const void* identity) const {
    Entry* entry = findByIdentity(identity);
    return EncodeGuard(entry != nullptr ? &entry->encodeLock() : nullptr);
  }

 private:
  const IdentityFn identity_;
  OnceCache<std::string, std::unique_ptr<Entry>> entries_;
  OnceCache<const void*, Entry*> by_identity_;
};

} // namespace at::mps
