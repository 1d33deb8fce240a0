#include <ATen/mps/MPSStreamActivity.h>

namespace at::mps {

int StreamActivity::activeStreams(Clock::time_point now) const {
  const int64_t current = stampOf(now);
  int active = 0;
  for (const Slot& slot : slots_) {
    const int64_t last = slot.last.load(std::memory_order_relaxed);
    if (last != 0 && current - last < kWindowMs) {
      ++active;
    }
  }
  return active;
}

StreamActivity& streamActivity() {
  // Only atomics: constant-initialised and trivially destructible, so usable
  // during static initialisation and destruction.
  static StreamActivity activity;
  return activity;
}

} // namespace at::mps
