#pragma once

#include <ATen/mps/MPSStreamPool.h>

#include <algorithm>
#include <exception>
#include <type_traits>
#include <utility>

namespace at::mps {

// Note [MPS serial sections]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each MPS stream encodes inside its serial section: blocks dispatch_sync'd
// onto its serial queue. dispatchSyncWithRethrow adds:
//  - Exceptions: a C++ exception must not unwind through libdispatch, so it
//    is caught on the queue and rethrown in the caller.
//  - Re-entry: dispatch_sync onto a queue whose block runs up the call chain
//    deadlocks, so a chain of SerialSections records the queues the call is
//    in and a dispatch onto any of them runs inline. The chain follows the
//    logical call, whichever thread libdispatch picks: a block's section
//    links to its dispatcher's. Sections live on the stack and a dispatcher
//    blocks until its block returns, so each outlives those linked below it.
// Code with its own dispatch_sync opens a SerialSection inside its block.
class TORCH_API SerialSection {
 public:
  // `outer`: the chain of the thread that dispatched this block.
  SerialSection(const void* queue, const SerialSection* outer) noexcept;
  ~SerialSection();
  C10_DISABLE_COPY_AND_ASSIGN(SerialSection);

  static const SerialSection* innermost() noexcept;
  static bool isActive(const void* queue) noexcept;

 private:
  const void* const queue_;
  const SerialSection* const outer_;
  const SerialSection* const saved_; // this thread's chain before this one
};

// Runs fn() in `queue`'s serial section (inline if already in it), rethrowing
// here. dispatch(ctx, work) must behave as dispatch_sync_f(queue, ctx, work).
template <typename Dispatch, typename Fn>
void dispatchSyncWithRethrow(const void* queue, Dispatch&& dispatch, Fn&& fn) {
  if (SerialSection::isActive(queue)) {
    std::forward<Fn>(fn)();
    return;
  }
  struct Call {
    const void* queue;
    const SerialSection* caller;
    std::remove_reference_t<Fn>* fn;
    std::exception_ptr error;
  } call{queue, SerialSection::innermost(), &fn, nullptr};
  std::forward<Dispatch>(dispatch)(static_cast<void*>(&call), [](void* ctx) {
    Call& c = *static_cast<Call*>(ctx);
    SerialSection section(c.queue, c.caller);
    try {
      (*c.fn)();
    } catch (...) {
      c.error = std::current_exception();
    }
  });
  if (call.error) {
    std::rethrow_exception(call.error);
  }
}

// Note [MPS active streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A stream calls noteEncoding(its pool slot) when it encodes; activeStreams()
// counts slots noted within the last kWindowMs (1 s, spanning a busy thread's
// host-side pauses). Encodes are counted, not leases: an idle thread keeps its
// lease (thread pools), and leases sit behind the pool mutex while this is
// lock-free (a relaxed load and, at most once per ms, a relaxed store to the
// slot's own cache line). The count is a recent-past estimate that misses a
// stream starting just after the read, so what must not overlap other encoding
// takes a lock too (Note [MPS Apple framework workarounds]).
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
  int activeStreams(Clock::time_point now = Clock::now()) const {
    const int64_t current = stampOf(now);
    return static_cast<int>(
        std::count_if(slots_.begin(), slots_.end(), [&](const Slot& slot) {
          const int64_t last = slot.last.load(std::memory_order_relaxed);
          return last != 0 && current - last < kWindowMs;
        }));
  }

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

// Note [MPS compute-encoder lifecycle gate]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dML (github.com/dropbox/dML) reports AGX driver crashes when one thread
// ends a compute encoder while another, on another queue, creates or uses
// one: a driver race our locking cannot prevent. With
// MPS_SERIALIZE_COMPUTE_ENCODERS=1, compute-encoder creation and endEncoding
// through run() (GatedEncoderOps, MPSGraph encodes) hold one process-wide
// mutex. Encoding into an open encoder is not gated, so streams still encode
// in parallel and the gate narrows the race rather than excluding it. Off
// (default), run() costs one branch. The variable is read on first use; a
// malformed value raises from every use (Note [MPS environment switches]).
//
// The mutex is a leaf lock: fn() must not enter a serial section, a
// command-buffer lifecycle lock or the gate, so callers evaluate
// commandBuffer()/commandEncoder() before run().
class TORCH_API EncoderLifecycleGate {
 public:
  explicit EncoderLifecycleGate(bool enabled) : enabled_(enabled) {}

  template <typename Fn>
  decltype(auto) run(Fn&& fn) MPS_EXCLUDES(mu_) {
    if (!enabled_) {
      return std::forward<Fn>(fn)();
    }
    MutexLock lock(mu_);
    return std::forward<Fn>(fn)();
  }

 private:
  const bool enabled_;
  Mutex mu_;
};

TORCH_API EncoderLifecycleGate& computeEncoderGate();

// Lifecycle ops (Note [MPS command buffer lifecycle]), gated.
template <typename Ops>
class GatedEncoderOps : public Ops {
 public:
  explicit GatedEncoderOps(
      Ops ops,
      EncoderLifecycleGate& gate = computeEncoderGate())
      : Ops(std::move(ops)), gate_(&gate) {}

  typename Ops::Encoder makeComputeEncoder(const typename Ops::Buffer& buffer) {
    return gate_->run([&]() { return Ops::makeComputeEncoder(buffer); });
  }
  void endEncoding(const typename Ops::Encoder& encoder) {
    gate_->run([&]() { Ops::endEncoding(encoder); });
  }

 private:
  EncoderLifecycleGate* gate_;
};

} // namespace at::mps
