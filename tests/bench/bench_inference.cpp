// Simulated inference throughput: N threads each encode a few kernels and
// wait for the result, on the simulated GPU.
//
//  - V291OneStream: v2.9.1's model. One stream whose serial queue is held
//    for the whole encode-and-wait (ops dispatch_sync onto it, and
//    COMMIT_AND_WAIT waits inside), modelled as one lock.
//  - Pool: each thread encodes on its own pool stream, and each kernel binds
//    its buffer through the dependency hook on the current stream, as
//    getMTLBufferStorage() does with the patch (v2.9.1 binds with a cast).
//
// Both use the same device: a GPU that runs at most kGpuParallelism command
// buffers at once, so extra queues cannot buy more GPU than there is. The
// CPU cost of encoding is a busy loop, so more threads than cores stop
// helping, as on a real machine.

#include <benchmark/benchmark.h>

#include "SimStream.h"

#include <ATen/mps/MPSStreamDependencies.h>

#include <chrono>
#include <mutex>

namespace {

constexpr int kKernelsPerInference = 4;
constexpr auto kEncodeCost = std::chrono::microseconds(10);
constexpr auto kGpuTime = std::chrono::microseconds(200);
constexpr size_t kGpuParallelism = 8;

sim::Device& device() {
  static auto* d = [] {
    sim::Config c;
    c.min_latency = kGpuTime;
    c.max_latency = kGpuTime;
    c.gpu_parallelism = kGpuParallelism;
    return new sim::Device(c); // leaked with the pool that uses it
  }();
  return *d;
}

void spin(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

template <typename Bind>
void inference(sim::SimStream& s, const sim::BufferPtr& buf, Bind&& bind) {
  s.serial([&](sim::Lifecycle& lc) {
    for (int k = 0; k < kKernelsPerInference; ++k) {
      spin(kEncodeCost);
      bind();
      lc.commandEncoder()->dispatch({{{buf, sim::Access::kRead}}, nullptr});
    }
    lc.synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  });
}

void BM_Inference_V291OneStream(benchmark::State& state) {
  static auto* stream = new sim::SimStream(device().newCommandQueue(), 0, true);
  static std::mutex serial_queue;
  auto buf = device().newBuffer(1);
  for (auto _ : state) {
    std::lock_guard<std::mutex> lock(serial_queue);
    inference(*stream, buf, [] {});
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Inference_V291OneStream)
    ->DenseThreadRange(1, 2)
    ->Threads(4)
    ->Threads(8)
    ->Threads(16)
    ->UseRealTime();

void BM_Inference_Pool(benchmark::State& state) {
  static auto* pool = new sim::SimStreamPool(
      std::make_unique<sim::SimStreamBackend>(device()),
      at::mps::StreamPoolOptions{});
  static auto* tracker = new at::mps::DependencyTracker();
  static auto* table = new at::mps::BufferUseTable();
  auto buf = device().newBuffer(1);
  tracker->registerStream(pool->currentStream());
  const auto bind = [&] {
    tracker->useInPass(
        pool->currentStream(), *table, buf.get(), at::mps::Access::kWrite);
  };
  for (auto _ : state) {
    inference(pool->currentStream(), buf, bind);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Inference_Pool)
    ->DenseThreadRange(1, 2)
    ->Threads(4)
    ->Threads(8)
    ->Threads(16)
    ->UseRealTime();

} // namespace
