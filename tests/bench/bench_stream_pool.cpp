// Micro-benchmarks of the pool's hot paths, each next to the v2.9.1 model it
// replaces, in the same binary so that ratios are taken side by side.

#include <benchmark/benchmark.h>

#include <ATen/mps/MPSStreamPool.h>

#include <memory>
#include <thread>

namespace {

struct Stream {
  int index;
};

class Backend : public at::mps::StreamBackend<Stream> {
 public:
  std::unique_ptr<Stream> create(at::mps::StreamIndex i) override {
    return std::make_unique<Stream>(Stream{i});
  }
  void synchronize(Stream&) override {}
  void onLeaseReleased(Stream&) override {}
};

// Leaked like the production pool. The first is what getCurrentMPSStream()
// uses (the main thread gets the default stream); the second makes every
// thread a worker, for the lease benchmarks.
at::mps::StreamPool<Stream>* const process_pool =
    new at::mps::StreamPool<Stream>(
        std::make_unique<Backend>(),
        at::mps::StreamPoolOptions{});
at::mps::StreamPool<Stream>* const worker_pool = [] {
  at::mps::StreamPoolOptions o;
  o.is_main_thread = [] { return false; };
  return new at::mps::StreamPool<Stream>(std::make_unique<Backend>(), o);
}();

// v2.9.1: MPSStreamImpl::getInstance() behind getCurrentMPSStream(), an
// out-of-line call from every op.
Stream* legacy_stream = nullptr;
__attribute__((noinline)) Stream* legacyGetCurrentStream() {
  if (legacy_stream == nullptr) {
    legacy_stream = new Stream{0};
  }
  return legacy_stream;
}

// The pool-backed getCurrentMPSStream(), also out of line.
__attribute__((noinline)) Stream* poolGetCurrentStream() {
  return &process_pool->currentStream();
}

void BM_CurrentStream_V291Singleton(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(legacyGetCurrentStream());
  }
}
BENCHMARK(BM_CurrentStream_V291Singleton)->ThreadRange(1, 2);

// Thread 0 is the main thread (default stream); others hold leases.
void BM_CurrentStream_Pool(benchmark::State& state) {
  poolGetCurrentStream(); // bind outside the timed loop
  for (auto _ : state) {
    benchmark::DoNotOptimize(poolGetCurrentStream());
  }
}
BENCHMARK(BM_CurrentStream_Pool)->ThreadRange(1, 2);

// One lease taken and returned on the calling thread: the pool work that a
// thread's first use and its exit add, without the cost of the thread.
void BM_LeaseAcquireRelease(benchmark::State& state) {
  auto& p = *worker_pool;
  for (auto _ : state) {
    benchmark::DoNotOptimize(p.currentIndex());
    p.releaseCurrentThreadSlot();
  }
}
BENCHMARK(BM_LeaseAcquireRelease);

// A whole thread lifetime with and without a lease, to show the lease's
// share of a short-lived thread.
void BM_ThreadLifetime_NoPool(benchmark::State& state) {
  for (auto _ : state) {
    std::thread([] { benchmark::ClobberMemory(); }).join();
  }
}
BENCHMARK(BM_ThreadLifetime_NoPool)->UseRealTime();

void BM_ThreadLifetime_LeaseOnFirstUse(benchmark::State& state) {
  auto& p = *worker_pool;
  for (auto _ : state) {
    std::thread([&p] { benchmark::DoNotOptimize(p.currentIndex()); }).join();
  }
}
BENCHMARK(BM_ThreadLifetime_LeaseOnFirstUse)->UseRealTime();

} // namespace
