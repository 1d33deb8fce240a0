#pragma once

// StreamSlotPool's private state, for the tests.

#include <ATen/mps/MPSStreamPool.h>

namespace at::mps {

struct StreamSlotPoolTestPeer {
  // Worker slots leased now.
  static int leasedSlots(StreamSlotPool& pool) {
    MutexLock lock(pool.mu_);
    return kWorkerStreams - __builtin_popcountll(pool.free_slots_);
  }
  // Note [MPS main thread lookup].
  static bool ownsMainCache(const StreamSlotPool& pool) {
    return pool.ownsMainCache();
  }
  static uintptr_t mainOwner(const StreamSlotPool& pool) {
    return pool.main_owner_.load();
  }
  // The stream the calling thread's lookups read without a TLS load, or null.
  static const void* mainCopy(const StreamSlotPool& pool) {
    return pool.main_key_.load() == detail::threadWord()
        ? pool.main_stream_.load()
        : nullptr;
  }
};

} // namespace at::mps
