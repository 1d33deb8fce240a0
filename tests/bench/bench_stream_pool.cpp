// Micro-benchmarks of the pool's leases. The current-stream lookup, next to
// its v2.9.1 model, is timed in bench_hot_paths.

#include <benchmark/benchmark.h>

#include "hot_paths.h"

#include <memory>
#include <thread>

namespace {

using bench::Backend;
using bench::Stream;

// Every thread is a worker, for the lease benchmarks.
at::mps::StreamPool<Stream>* const worker_pool = [] {
  at::mps::StreamPoolOptions o;
  o.is_main_thread = [] { return false; };
  return new at::mps::StreamPool<Stream>(std::make_unique<Backend>(), o);
}();

// One lease taken and returned on the calling thread: the pool work that a
// thread's first use and its exit add, without the cost of the thread.
void BM_LeaseAcquireRelease(benchmark::State& state) {
  auto& p = *worker_pool;
  for (auto _ : state) {
    benchmark::DoNotOptimize(p.slots().currentIndex());
    p.slots().releaseCurrentThreadSlot();
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
    std::thread([&p] {
      benchmark::DoNotOptimize(p.slots().currentIndex());
    }).join();
  }
}
BENCHMARK(BM_ThreadLifetime_LeaseOnFirstUse)->UseRealTime();

} // namespace
