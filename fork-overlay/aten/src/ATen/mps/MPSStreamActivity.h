#pragma once

// Which MPS streams have encoded work recently: how many streams may be
// encoding concurrently right now.

#include <ATen/mps/MPSStreamPool.h>
#include <c10/macros/Export.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace at::mps {

// Note [MPS active streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Some decisions depend on whether more than one stream is encoding at the
// same time (Note [MPS Apple framework workarounds]). Each stream reports
// "I am encoding now" with noteEncoding(its pool slot); activeStreams()
// counts the slots that reported within the last `window`. Counting encodes
// rather than leases is deliberate: a thread keeps its leased slot for its
// whole life, idle or not (thread pools), while what matters is concurrent
// encoding; and the pool's lease count sits behind the pool mutex, while this
// is lock-free.
//
// Cost: noteEncoding() is one relaxed load of the slot's millisecond stamp
// and, at most once per millisecond per stream, a relaxed store; each slot
// has its own cache line, so streams never write a shared line.
// activeStreams() is kStreamsPerPool relaxed loads.
//
// The count is a recent-past estimate, not a lock: a stream that starts
// encoding right after another thread read the count is not in it. Decisions
// that must never overlap some other encoding need a lock as well (the
// family locks of the workarounds). The window (1 s by default) is long
// compared with the gaps between the ops of a busy thread, so a thread
// counts as active through its pauses for host-side work.
class TORCH_API StreamActivity {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kDefaultWindow{1000};

  constexpr explicit StreamActivity(
      std::chrono::milliseconds window = kDefaultWindow)
      : window_ms_(window.count()) {}
  StreamActivity(const StreamActivity&) = delete;
  StreamActivity& operator=(const StreamActivity&) = delete;

  // Stream `index` is encoding at `now`.
  void noteEncoding(StreamIndex index, Clock::time_point now = Clock::now()) {
    TORCH_CHECK(
        index >= 0 && index < kStreamsPerPool,
        "MPS stream activity: stream index out of range: ",
        index);
    const uint64_t stamp = stampOf(now);
    std::atomic<uint64_t>& last = slots_[index].last;
    if (last.load(std::memory_order_relaxed) != stamp) {
      last.store(stamp, std::memory_order_relaxed);
    }
  }

  // Streams whose last noteEncoding() lies within the window ending at
  // `now`; a stamp later than `now` (another thread's clock read) counts.
  int activeStreams(Clock::time_point now = Clock::now()) const;

 private:
  // Milliseconds on the steady clock, plus one so that 0 means "never".
  static uint64_t stampOf(Clock::time_point t) {
    return static_cast<uint64_t>(
               std::chrono::duration_cast<std::chrono::milliseconds>(
                   t.time_since_epoch())
                   .count()) +
        1;
  }

  struct alignas(64) Slot {
    std::atomic<uint64_t> last{0};
  };
  std::array<Slot, kStreamsPerPool> slots_{};
  const int64_t window_ms_;
};

// The process-wide instance that MPS streams report to.
TORCH_API StreamActivity& streamActivity();

} // namespace at::mps
