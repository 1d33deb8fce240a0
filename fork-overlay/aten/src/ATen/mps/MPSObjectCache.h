#pragma once

#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

namespace at::mps {

// Note [MPS create-once cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Maps keys to values made by create() on first request (Metal libraries,
// pipeline states, ObjectCache's MPSGraphs). For any number of threads:
//  - create() runs unlocked, for one key on one thread at a time; concurrent
//    requests for that key wait, other keys proceed.
//  - Only a successful create()'s value is ever stored or returned for its
//    key: no racer builds, discards or leaks a duplicate.
//  - If create() throws, its caller gets the exception, and a waiting (or
//    the next) request runs create() again.
//  - create() requesting its own key raises instead of waiting for itself.
//  - Values never move and are never removed (no eviction): callers keep
//    raw references past the lookup.
// Independently locked shards keep hits on different keys from contending.
template <typename Key, typename Value, typename Hash = std::hash<Key>>
class OnceCache {
 public:
  template <typename Create>
  const Value& getOrCreate(const Key& key, Create&& create) {
    Shard& shard = shardFor(key);
    Slot* mine = nullptr;
    {
      MutexLock lock(shard.mu);
      for (;;) {
        auto it = shard.slots.find(key);
        if (it == shard.slots.end()) {
          mine = (shard.slots[key] = std::make_unique<Slot>()).get();
          break;
        }
        if (it->second->value.has_value()) {
          return *it->second->value;
        }
        TORCH_CHECK(
            it->second->creator != std::this_thread::get_id(),
            "MPS cache: recursive creation of a key would wait for itself");
        shard.created.wait(shard.mu);
      }
    }
    try {
      Value made = std::forward<Create>(create)();
      MutexLock lock(shard.mu);
      mine->value.emplace(std::move(made));
      shard.created.notifyAll();
      return *mine->value;
    } catch (...) {
      MutexLock lock(shard.mu);
      shard.slots.erase(key);
      shard.created.notifyAll();
      throw;
    }
  }

  // nullptr if absent or still being created; never waits.
  const Value* find(const Key& key) const {
    const Shard& shard = shardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.slots.find(key);
    return it != shard.slots.end() && it->second->value ? &*it->second->value
                                                        : nullptr;
  }

  // Runs fn({key, value}) under the shard lock: fn must not re-enter the cache.
  template <typename Fn>
  void forEach(Fn&& fn) const {
    for (const Shard& shard : shards_) {
      MutexLock lock(shard.mu);
      for (const auto& [key, slot] : shard.slots) {
        if (slot->value.has_value()) {
          fn(std::pair<const Key&, const Value&>(key, *slot->value));
        }
      }
    }
  }

 private:
  static constexpr int kShardBits = 4;

  struct Slot {
    std::optional<Value> value; // immutable once engaged
    std::thread::id creator = std::this_thread::get_id(); // runs create()
  };
  struct Shard {
    mutable Mutex mu;
    CondVar created;
    std::unordered_map<Key, std::unique_ptr<Slot>, Hash> slots
        MPS_GUARDED_BY(mu);
  };

  Shard& shardFor(const Key& key) const {
    // Fibonacci hashing: top bits mix all bits, even for pointer keys.
    const uint64_t h =
        static_cast<uint64_t>(Hash{}(key)) * 0x9E3779B97F4A7C15ull;
    return shards_[h >> (64 - kShardBits)];
  }

  mutable std::array<Shard, size_t{1} << kShardBits> shards_;
};

// Note [MPS graph and kernel caches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Apple forbids encoding one MPSKernel from two threads at once (MPSGraph is
// undocumented), and streams on different threads can reach one cached
// object together. MPSGraphCache and MPSKernelCache keep one object per key
// (Note [MPS create-once cache]; per-thread caches would build, compile and
// keep every graph per thread). Every encode of a cached graph holds its
// encode lock: one graph's encodes serialise, different graphs' run in
// parallel. Cached kernels (no-graph nn.Linear's) need none: they are encoded
// only under their family lock (Note [MPS Apple framework workarounds]).
// Encode locks are keyed by object address, as runMPSGraph gets only an
// MPSGraph*; an object not from the cache gets a no-op guard. EncodeGuard is
// re-entrant per thread: two layers of the encoding path may guard one encode.
//
// Lock order: a graph's encode lock before its stream's serial section
// (runMPSGraph). Under one, only the stream's own locks (serial section,
// command-buffer lifecycle, encoder gate) are taken, never another encode
// lock or a family lock.
struct EncodeLock {
  Mutex mu;
  // Written only by the holder: a relaxed load sees our id iff we hold it.
  std::atomic<std::thread::id> holder{};
};

// Holds `lock` unless null or held by this thread (beyond the analysis).
class EncodeGuard {
 public:
  explicit EncodeGuard(EncodeLock* lock) MPS_NO_THREAD_SAFETY_ANALYSIS {
    if (lock != nullptr &&
        lock->holder.load(std::memory_order_relaxed) !=
            std::this_thread::get_id()) {
      lock->mu.lock();
      lock->holder.store(std::this_thread::get_id(), std::memory_order_relaxed);
      lock_ = lock;
    }
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

// Values by key, created once, with encode locks by their objects' identity.
template <typename Value>
class ObjectCache : private OnceCache<std::string, Value> {
 public:
  using IdentityFn = const void* (*)(const Value&);
  using OnceCache<std::string, Value>::find;

  explicit ObjectCache(IdentityFn identity) : identity_(identity) {}

  // create()'s value must hold an object: a non-null identity.
  template <typename Create>
  const Value& getOrCreate(const std::string& key, Create&& create) {
    return OnceCache<std::string, Value>::getOrCreate(key, [&]() {
      Value value = std::forward<Create>(create)();
      const void* const identity = identity_(value);
      TORCH_CHECK(
          identity, "creating the object for key '", key, "' returned null");
      bool fresh = false;
      locks_.getOrCreate(identity, [&]() {
        fresh = true;
        return std::make_unique<EncodeLock>();
      });
      TORCH_INTERNAL_ASSERT(
          fresh, "two MPS cache entries hold one object (key '", key, "')");
      return value;
    });
  }

  EncodeGuard encodeGuard(const void* identity) const {
    const std::unique_ptr<EncodeLock>* lock = locks_.find(identity);
    return EncodeGuard(lock != nullptr ? lock->get() : nullptr);
  }

 private:
  const IdentityFn identity_;
  OnceCache<const void*, std::unique_ptr<EncodeLock>> locks_;
};

} // namespace at::mps
