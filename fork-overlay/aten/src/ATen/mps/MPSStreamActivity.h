#pragma once

#include <ATen/mps/MPSStreamPool.h>
#include <c10/macros/Export.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace at::mps {

// Note [MPS active streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A stream calls noteEncoding(its pool slot) when it encodes; activeStreams()
// counts slots noted within the last kWindowMs (1 s, spanning a busy thread's
// host-side pauses). Encodes are counted, not leases: an idle thread keeps
// its lease (thread pools), and leases sit behind the pool mutex while this
// is lock-free (a relaxed load and, at most once per ms, a relaxed store to
// the stream's own cache line). The count is a recent-past estimate, not a
// lock: a stream starting just after a read is missed, so decisions that
// must not overlap other encoding also need a lock (the family locks of
// Note [MPS Apple framework workarounds]).
class TORCH_API StreamActivity {
 public:
  using Clock = std::chrono::steady_clock;

  void noteEncoding(StreamIndex index, Clock::time_point now = Clock::now()) {
    checkStreamIndex(index);
    const int64_t stamp = stampOf(now);
    std::atomic<int64_t>& last = slots_[index].last;
    if (last.load(std::memory_order_relaxed) != stamp) {
      last.store(stamp, std::memory_order_relaxed);
    }
  }

  // A stamp later than `now` (another thread's clock read) counts.
  int activeStreams(Clock::time_point now = Clock::now()) const;

 private:
  // Milliseconds on the steady clock, plus one so that 0 means "never".
  static int64_t stampOf(Clock::time_point t) {
    return t.time_since_epoch() / std::chrono::milliseconds(1) + 1;
  }

  struct alignas(64) Slot {
    std::atomic<int64_t> last{0};
  };
  std::array<Slot, kStreamsPerPool> slots_{};
  static constexpr int64_t kWindowMs = 1000;
};

TORCH_API StreamActivity& streamActivity();

} // namespace at::mps
