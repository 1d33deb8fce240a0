#pragma once

// StreamSlotPool's private state, for the tests.

#include <ATen/mps/MPSStreamPool.h>

namespace at::mps {

struct StreamSlotPoolTestPeer {
  static uint64_t id(const StreamSlotPool& pool) {
    return pool.id_;
  }
  // Worker slots leased now.
  static int leasedSlots(StreamSlotPool& pool) {
    MutexLock lock(pool.mu_);
    return kWorkerStreams - static_cast<int>(pool.free_slots_.size());
  }
};

} // namespace at::mps
