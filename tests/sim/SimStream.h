#pragma once

// The harness's MPSStream: a simulated command queue driven by the same
// portable CommandBufferLifecycle and StreamPool that PyTorch uses.

#include "SimMetal.h"

#include <ATen/mps/MPSCommandBufferLifecycle.h>
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
  void release(const Buffer&) {}
  bool lowWatermarkReached() const {
    return low_watermark->load();
  }
};

using Lifecycle = at::mps::CommandBufferLifecycle<SimOps>;

class SimStream {
 public:
  SimStream(
      QueuePtr queue,
      at::mps::StreamIndex index,
      bool commit_and_continue)
      : index_(index),
        queue_(queue),
        lifecycle_(SimOps{}, std::move(queue), commit_and_continue) {}

  at::mps::StreamIndex index() const {
    return index_;
  }
  Queue& queue() const {
    return *queue_;
  }
  Lifecycle& lifecycle() {
    return lifecycle_;
  }

  // The stream's serial section: what dispatch_sync(stream->queue(), ...)
  // is for MPSStream, re-entrant like MPSStream's entry points (which run
  // inline when already on the stream's queue). Every multi-step encoding
  // sequence runs inside it, and so does every entry point below: a caller
  // outside it could end the encoder another thread is still dispatching
  // into (LifecycleTest.SyncOutsideTheSerialSectionBreaksAnEncoderInUse).
  template <typename Fn>
  decltype(auto) serial(Fn&& fn) {
    std::lock_guard<std::recursive_mutex> lock(serial_);
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

 private:
  const at::mps::StreamIndex index_;
  const QueuePtr queue_;
  std::recursive_mutex serial_;
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
        at::mps::resolveCommitAndContinue(index, cac_env_, false));
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

} // namespace sim
