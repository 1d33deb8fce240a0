#pragma once

// A thread-safe map whose values are created at most once per key, with no
// lock held while a value is being created. The MPS shader-library and
// pipeline-state caches use it directly; the graph and kernel caches build on
// it (see MPSObjectCache.h).

#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

namespace at::mps {

// Note [MPS create-once cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// OnceCache<Key, Value> maps keys to values made by a caller-supplied
// create() on first request. Guarantees, for any number of threads:
//  - For each key, create() runs on one thread at a time, and once one run
//    succeeds its value is the only value ever stored or returned for that
//    key. No losing racer's value is ever produced, so nothing is discarded
//    or leaked (compiled Metal libraries, pipeline states, MPSGraphs).
//  - create() runs with no lock held. A concurrent request for the same key
//    waits for that run instead of starting its own; requests for other keys
//    (hits or misses) proceed.
//  - If create() throws, nothing is stored, the exception goes to its caller,
//    and one of the waiting requests (or the next request) runs create()
//    again.
//  - A thread that requests the key it is itself creating (create() recursing
//    into its own key) gets an error instead of waiting for itself forever.
//  - A stored value never moves and is never removed or replaced: references
//    returned by getOrCreate()/find() stay valid for the cache's lifetime.
//    There is no eviction, as in v2.9.1: callers keep raw references to
//    cached objects past the lookup.
// Keys are spread over kShards independently locked shards so that hits on
// different keys from many threads do not contend on one mutex. Each lookup
// takes one shard mutex for a hash-map find; creation notifies the waiters of
// its shard.
template <typename Key, typename Value, typename Hash = std::hash<Key>>
class OnceCache {
 public:
  OnceCache() = default;
  OnceCache(const OnceCache&) = delete;
  OnceCache& operator=(const OnceCache&) = delete;

  // The value for `key`, calling create() (returning something convertible to
  // Value) if it does not exist yet; see Note [MPS create-once cache].
  template <typename Create>
  const Value& getOrCreate(const Key& key, Create&& create) {
    Shard& shard = shardFor(key);
    Slot* mine = nullptr;
    {
      MutexLock lock(shard.mu);
      for (;;) {
        auto it = shard.slots.find(key);
        if (it == shard.slots.end()) {
          auto slot = std::make_unique<Slot>();
          slot->creator = std::this_thread::get_id();
          mine = slot.get();
          shard.slots.emplace(key, std::move(slot));
          break;
        }
        if (it->second->value.has_value()) {
          return *it->second->value;
        }
        TORCH_CHECK(
            it->second->creator != std::this_thread::get_id(),
            "MPS cache: a value requested its own key while being created "
            "(recursive creation would wait for itself)");
        shard.created.wait(shard.mu);
      }
    }
    // This thread creates the value, without holding the shard lock.
    std::optional<Value> made;
    try {
      made.emplace(std::forward<Create>(create)());
    } catch (...) {
      MutexLock lock(shard.mu);
      shard.slots.erase(key);
      shard.created.notifyAll();
      throw;
    }
    MutexLock lock(shard.mu);
    mine->value.emplace(std::move(*made));
    shard.created.notifyAll();
    return *mine->value;
  }

  // The value for `key` if it has been created; nullptr if it is absent or
  // still being created. Never waits for a creation.
  const Value* find(const Key& key) const {
    const Shard& shard = shardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.slots.find(key);
    if (it == shard.slots.end() || !it->second->value.has_value()) {
      return nullptr;
    }
    return &*it->second->value;
  }

  // Calls fn(key, value) for every created value, holding each shard's lock
  // while visiting it: fn must not call back into this cache.
  template <typename Fn>
  void forEach(Fn&& fn) const {
    for (const Shard& shard : shards_) {
      MutexLock lock(shard.mu);
      for (const auto& [key, slot] : shard.slots) {
        if (slot->value.has_value()) {
          fn(key, *slot->value);
        }
      }
    }
  }

 private:
  static constexpr int kShardBits = 4;
  static constexpr size_t kShards = size_t{1} << kShardBits;

  struct Slot {
    std::optional<Value> value; // engaged once created; immutable after
    std::thread::id creator; // the creating thread while value is empty
  };
  struct Shard {
    mutable Mutex mu;
    CondVar created;
    std::unordered_map<Key, std::unique_ptr<Slot>, Hash> slots
        MPS_GUARDED_BY(mu);
  };

  Shard& shardFor(const Key& key) const {
    // Fibonacci hashing: the top bits of the product mix every input bit,
    // also for pointer keys whose low bits are constant.
    const uint64_t h =
        static_cast<uint64_t>(Hash{}(key)) * 0x9E3779B97F4A7C15ull;
    return shards_[h >> (64 - kShardBits)];
  }

  mutable std::array<Shard, kShards> shards_;
};

} // namespace at::mps
