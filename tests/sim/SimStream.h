#pragma once

// The harness's MPSStream: a simulated command queue driven by the same
// portable CommandBufferLifecycle and StreamPool that PyTorch uses.

#include "SimMetal.h"

#include <ATen/mps/MPSCommandBufferLifecycle.h>
#include <ATen/mps/MPSStreamDependencies.h>
#include <ATen/mps/MPSStreamPool.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

namespace sim {

// The Metal operations of CommandBufferLifecycle, on the simulator.
struct SimOps {
  using Queue = QueuePtr;
  using Buffer = CommandBufferPtr;
  using Encoder = EncoderPtr;

  // Read by COMMIT_ADAPTIVE; stands in for the allocator's low watermark.
  std::shared_ptr<std::atomic<bool>> low_watermark =
      std::make_shared<std::atomic<bool>>(false);
  // The stream's timeline event (Note [MPS cross-stream dependencies]).
  SharedEventPtr timeline;

  Buffer makeBuffer(const Queue& queue) {
    return queue->makeCommandBuffer();
  }
  Encoder makeComputeEncoder(const Buffer& buffer) {
    return buffer->computeEncoder();
  }
  void endEncoding(const Encoder& encoder) {
    encoder->endEncoding();
  }
  void commit(const Buffer& buffer) {
    buffer->commit();
  }
  void commitAndContinue(const Buffer& buffer) {
    buffer->commitAndContinue();
  }
  void addCompletedHandler(
      const Buffer& buffer,
      at::mps::CompletionHandler handler) {
    buffer->addCompletedHandler(
        [handler = std::move(handler)](const Status& s) {
          handler(at::mps::CompletionStatus{s.ok, s.error});
        });
  }
  void signalTimeline(const Buffer& buffer, uint64_t point) {
    buffer->encodeSignal(timeline, point);
  }
  bool lowWatermarkReached() const {
    return low_watermark->load();
  }
};

using Lifecycle = at::mps::CommandBufferLifecycle<SimOps>;

class SimStream final : public at::mps::DependencyStream {
 public:
  SimStream(
      QueuePtr queue,
      at::mps::StreamIndex index,
      bool commit_and_continue)
      : DependencyStream(index),
        queue_(std::move(queue)),
        ops_(makeOps(*queue_)),
        lifecycle_(ops_, queue_, commit_and_continue) {
    bindOpenMark(lifecycle_.openMarkAtomic());
  }

  Queue& queue() const {
    return *queue_;
  }
  Lifecycle& lifecycle() {
    return lifecycle_;
  }
  // A copy of the lifecycle's ops: the same event and low watermark.
  const SimOps& ops() const {
    return ops_;
  }

  // The stream's serial section: what dispatch_sync(stream->queue(), ...)
  // is for MPSStream, re-entrant like MPSStream's entry points (which run
  // inline when already on the stream's queue). Every multi-step encoding
  // sequence runs inside it, and so does every entry point below: a caller
  // outside it could end the encoder another thread is still dispatching
  // into (LifecycleTest.SyncOutsideTheSerialSectionBreaksAnEncoderInUse).
  template <typename Fn>
  decltype(auto) serial(Fn&& fn) {
    // Flush requests run only when the outermost section is left, as a
    // dispatch_async block waits for the queue to be free: never in the
    // middle of an op that re-enters the section.
    struct Exit {
      SimStream* s;
      ~Exit() {
        if (--s->depth_ == 0) {
          s->serviceFlushRequest();
        }
        s->serial_.unlock();
        s->serviceFlushRequestIfFree(); // a request that raced the unlock
      }
    };
    serial_.lock();
    ++depth_;
    Exit exit{this};
    return fn(lifecycle_);
  }

  // Encodes one kernel into the stream's coalesced compute encoder and
  // applies `sync`, the way a PyTorch op does.
  void encodeKernel(Kernel kernel, at::mps::SyncType sync) {
    serial([&](Lifecycle& lc) {
      lc.commandEncoder()->dispatch(std::move(kernel));
      lc.synchronize(sync);
    });
  }
  void synchronize(at::mps::SyncType sync) {
    serial([&](Lifecycle& lc) { lc.synchronize(sync); });
  }
  void addCompletedHandler(at::mps::CompletionHandler handler) {
    serial([&](Lifecycle& lc) { lc.addCompletedHandler(std::move(handler)); });
  }

  // DependencyStream: what MPSStream implements with its timeline
  // MTLSharedEvent and dispatch_async.
  uint64_t committedMark() const override {
    return lifecycle_.committedMark();
  }
  uint64_t completedMark() const override {
    return ops_.timeline->signaledValue();
  }
  // Commits through `mark` now if the serial section is free, else when it
  // is next left, as a dispatch_async block would.
  void flushAsync(uint64_t mark) override {
    flush_requests_.fetch_add(1, std::memory_order_relaxed);
    uint64_t want = flush_mark_.load(std::memory_order_seq_cst);
    while (want < mark &&
           !flush_mark_.compare_exchange_weak(
               want, mark, std::memory_order_seq_cst)) {
    }
    serviceFlushRequestIfFree();
  }
  // How often another stream asked this one to commit.
  uint64_t flushRequests() const {
    return flush_requests_.load(std::memory_order_relaxed);
  }
  // The tracker's waits: GPU waits this stream encoded, and waits for this
  // stream's marks to complete (on the CPU) or to be committed.
  struct Waits {
    std::atomic<uint64_t> gpu{0};
    std::atomic<uint64_t> cpu{0};
    std::atomic<uint64_t> commit{0};
  };
  const Waits& waits() const {
    return waits_;
  }
  void closePass(bool signal_if_empty) override {
    serial([&](Lifecycle& lc) { lc.endKernelCoalescing(signal_if_empty); });
  }
  void commitOpen() override {
    serial([](Lifecycle& lc) { lc.synchronize(at::mps::SyncType::COMMIT); });
  }
  void encodeWait(DependencyStream& producer, uint64_t mark) override {
    auto& p = static_cast<SimStream&>(producer);
    // No encoder is open (closePass() ran); the wait joins the op's pass.
    serial([&](Lifecycle& lc) {
      lc.commandBuffer()->encodeWait(p.ops_.timeline, mark);
    });
    waits_.gpu.fetch_add(1);
  }
  void waitCommitted(uint64_t mark) override {
    lifecycle_.waitForCommittedMark(mark);
    waits_.commit.fetch_add(1);
  }
  void waitCompleted(uint64_t mark) override {
    const auto& timeline = ops_.timeline;
    TORCH_CHECK(
        timeline->waitFor(mark, queue_->device()->config().event_wait_timeout),
        "simulated MPS stream ",
        index(),
        ": timed out waiting for mark ",
        mark);
    waits_.cpu.fetch_add(1);
  }

 private:
  static SimOps makeOps(Queue& queue) {
    SimOps ops;
    ops.timeline = queue.device()->newSharedEvent();
    return ops;
  }
  void serviceFlushRequest() {
    const uint64_t mark = flush_mark_.exchange(0, std::memory_order_seq_cst);
    if (mark != 0) {
      lifecycle_.commitThrough(mark);
    }
  }
  void serviceFlushRequestIfFree() {
    while (flush_mark_.load(std::memory_order_seq_cst) != 0 &&
           serial_.try_lock()) {
      // try_lock succeeds for a thread already inside (recursive mutex);
      // only a free section may be flushed.
      const bool free = depth_ == 0;
      if (free) {
        serviceFlushRequest();
      }
      serial_.unlock();
      if (!free) {
        return; // the holder services it on its way out
      }
    }
  }

  const QueuePtr queue_;
  const SimOps ops_;
  std::recursive_mutex serial_;
  int depth_ = 0; // nesting of serial(); only touched with serial_ held
  std::atomic<uint64_t> flush_mark_{0}; // highest mark asked for, 0: none
  std::atomic<uint64_t> flush_requests_{0};
  Waits waits_;
  Lifecycle lifecycle_;
};

// StreamPool hooks on the simulator: one queue per stream; commitAndContinue
// per the production rule (stream 0 only, unless overridden).
class SimStreamBackend : public at::mps::StreamBackend<SimStream> {
 public:
  explicit SimStreamBackend(Device& device, const char* cac_env = nullptr)
      : device_(device), cac_env_(cac_env) {}

  std::unique_ptr<SimStream> create(at::mps::StreamIndex index) override {
    QueuePtr queue = device_.newCommandQueue();
    if (!queue) {
      return nullptr;
    }
    return std::make_unique<SimStream>(
        std::move(queue),
        index,
        at::mps::resolveCommitAndContinue(index, cac_env_));
  }
  void synchronize(SimStream& stream) override {
    stream.synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  }
  void onLeaseReleased(SimStream& stream) override {
    stream.synchronize(at::mps::SyncType::COMMIT);
  }

 private:
  Device& device_;
  const char* cac_env_;
};

using SimStreamPool = at::mps::StreamPool<SimStream>;

// RAII: makes a slot current for the calling thread and restores the
// previous one on scope exit, like c10::cuda::CUDAStreamGuard
// (PyTorch goes through c10::StreamGuard and MPSGuardImpl instead).
template <typename Pool>
class CurrentStreamGuard {
 public:
  CurrentStreamGuard(Pool& pool, at::mps::StreamIndex index)
      : pool_(pool), previous_(pool.slots().exchangeCurrentIndex(index)) {}
  ~CurrentStreamGuard() {
    pool_.slots().exchangeCurrentIndex(previous_);
  }
  CurrentStreamGuard(const CurrentStreamGuard&) = delete;
  CurrentStreamGuard& operator=(const CurrentStreamGuard&) = delete;

  at::mps::StreamIndex previous() const {
    return previous_;
  }

 private:
  Pool& pool_;
  const at::mps::StreamIndex previous_;
};

} // namespace sim
