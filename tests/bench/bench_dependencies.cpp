// Cost of cross-stream dependency tracking (Note [MPS cross-stream
// dependencies]): a producer -> consumer thread pipeline with automatic
// tracking against the explicit synchronize() a user would otherwise write.
// The hook's same-stream fast path is timed in bench_hot_paths.

#include <benchmark/benchmark.h>

#include "SimStream.h"

#include <ATen/mps/MPSStreamDependencies.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace {

using at::mps::Access;
using at::mps::SyncType;
using at::mps::UseSite;

// A producer thread makes tensors on its stream and hands them to a consumer
// thread on another stream, which reads them and writes a result.
struct Pipeline {
  explicit Pipeline(bool tracked) : tracked(tracked) {
    sim::Config c;
    c.min_latency = c.max_latency = std::chrono::microseconds(100);
    device = std::make_unique<sim::Device>(c);
    producer =
        std::make_unique<sim::SimStream>(device->newCommandQueue(), 1, false);
    consumer =
        std::make_unique<sim::SimStream>(device->newCommandQueue(), 2, false);
    tracker.registerStream(*producer);
    tracker.registerStream(*consumer);
  }
  ~Pipeline() {
    producer->synchronize(SyncType::COMMIT_AND_WAIT);
    consumer->synchronize(SyncType::COMMIT_AND_WAIT);
  }

  struct Item {
    sim::BufferPtr buf;
    at::mps::BufferUses* uses;
  };

  void produce(const Item& item) {
    producer->serial([&](sim::Lifecycle& lc) {
      if (tracked) {
        tracker.use(
            *producer, *item.uses, Access::kWrite, UseSite::kBeforeEncoding);
      }
      lc.commandEncoder()->dispatch(
          {{{item.buf, sim::Access::kWrite}}, nullptr});
      // Tracked: commit, never wait. Explicit: what users write today.
      lc.synchronize(tracked ? SyncType::COMMIT : SyncType::COMMIT_AND_WAIT);
    });
  }
  void consume(const Item& item, const Item& out) {
    consumer->serial([&](sim::Lifecycle& lc) {
      if (tracked) {
        const at::mps::DependencyTracker::Use uses[] = {
            {item.uses, Access::kRead}, {out.uses, Access::kWrite}};
        tracker.use(*consumer, uses, 2, UseSite::kBeforeEncoding);
      }
      lc.commandEncoder()->dispatch(
          {{{item.buf, sim::Access::kRead}, {out.buf, sim::Access::kWrite}},
           nullptr});
      lc.synchronize(SyncType::COMMIT);
    });
  }

  const bool tracked;
  std::unique_ptr<sim::Device> device;
  std::unique_ptr<sim::SimStream> producer, consumer;
  at::mps::DependencyTracker tracker;
  at::mps::BufferUseTable table;
};

void runPipeline(benchmark::State& state, bool tracked) {
  constexpr int kItems = 64;
  Pipeline p(tracked);
  std::vector<Pipeline::Item> in, out;
  for (int i = 0; i < kItems; ++i) {
    auto a = p.device->newBuffer(1), b = p.device->newBuffer(1);
    in.push_back({a, &p.table.get(a.get())});
    out.push_back({b, &p.table.get(b.get())});
  }
  for (auto _ : state) {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<int> ready;
    std::thread producer([&] {
      for (int i = 0; i < kItems; ++i) {
        p.produce(in[i]);
        std::lock_guard<std::mutex> lock(mu);
        ready.push_back(i);
        cv.notify_one();
      }
    });
    for (int n = 0; n < kItems; ++n) {
      int i = 0;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !ready.empty(); });
        i = ready.front();
        ready.pop_front();
      }
      p.consume(in[i], out[i]);
    }
    producer.join();
    p.consumer->synchronize(SyncType::COMMIT_AND_WAIT);
  }
  state.SetItemsProcessed(state.iterations() * kItems);
}

void BM_Pipeline_ExplicitSynchronize(benchmark::State& state) {
  runPipeline(state, false);
}
BENCHMARK(BM_Pipeline_ExplicitSynchronize)->UseRealTime();

void BM_Pipeline_AutomaticTracking(benchmark::State& state) {
  runPipeline(state, true);
}
BENCHMARK(BM_Pipeline_AutomaticTracking)->UseRealTime();

} // namespace
