#include <ATen/mps/MPSStreamActivity.h>

namespace at::mps {

int StreamActivity::activeStreams(Clock::time_point now) const {
  const int64_t current = static_cast<int64_t>(stampOf(now));
  int active = 0;
  for (const Slot& slot : slots_) {
    const uint64_t last = slot.last.load(std::memory_order_relaxed);
    if (last != 0 && current - static_cast<int64_t>(last) < window_ms_) {
      ++active;
    }
  }
  return active;
}

StreamActivity& streamActivity() {
  // Only atomics: trivially destructible, so safe to use during static
  // destruction; constant-initialized, so safe during static initialization.
  static StreamActivity activity;
  return activity;
}

} // namespace at::mps
