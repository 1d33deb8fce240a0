#pragma once

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
// Maps keys to values made by create() on first request (shader-library and
// pipeline-state caches, ObjectCache). For any number of threads:
//  - create() runs unlocked, for one key on one thread at a time; concurrent
//    requests for that key wait, other keys proceed.
//  - A successful create()'s value is the only one ever stored or returned
//    for its key: no racer builds, discards or leaks a duplicate (Metal
//    libraries, pipeline states, MPSGraphs).
//  - If create() throws, nothing is stored, its caller gets the exception,
//    and a waiting (or the next) request runs create() again.
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
          mine = shard.slots.emplace(key, std::make_unique<Slot>())
                     .first->second.get();
          mine->creator = std::this_thread::get_id();
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

  // nullptr if absent or still being created; never waits.
  const Value* find(const Key& key) const {
    const Shard& shard = shardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.slots.find(key);
    if (it == shard.slots.end() || !it->second->value.has_value()) {
      return nullptr;
    }
    return &*it->second->value;
  }

  // Runs fn(key, value) under the shard lock: fn must not re-enter the cache.
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

  struct Slot {
    std::optional<Value> value; // immutable once engaged
    std::thread::id creator; // while value is empty
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

} // namespace at::mps
