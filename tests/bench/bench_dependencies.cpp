// Cost of cross-stream dependency tracking (Note [MPS cross-stream
// dependencies]): a producer -> consumer thread pipeline with automatic
// tracking against the explicit synchronize() a user would otherwise write,
// and threads whose kernels read one shared tensor. The hook's same-stream
// fast path is timed in bench_hot_paths.

#include <benchmark/benchmark.h>

#include "SimStream.h"

#include <ATen/mps/MPSStreamDependencies.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

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
        const at::mps::DependencyTracker::Use use{item.uses, Access::kWrite};
        tracker.use(*producer, use, UseSite::kBeforeEncoding);
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
        tracker.use(*consumer, uses, UseSite::kBeforeEncoding);
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

// Threads with streams of their own run ops that bind one shared weight and
// an output of their own with the compute encoder open, as elementwise
// kernels bind them (the in-pass hook), one op per pass, committed. The
// kernel reads the weight; the hook records it as a read (a TensorIterator
// input) or as a write (how every kernel binding used to be recorded, which
// makes each op wait on the CPU for the other streams' kernels).
void BM_SharedWeight(benchmark::State& state, Access weight_access) {
  constexpr int kOps = 32;
  const int threads = static_cast<int>(state.range(0));
  sim::Config c;
  c.min_latency = c.max_latency = std::chrono::microseconds(100);
  sim::Device device(c);
  at::mps::DependencyTracker tracker;
  at::mps::BufferUseTable table;
  std::vector<std::unique_ptr<sim::SimStream>> streams;
  std::vector<sim::BufferPtr> outs;
  for (int t = 0; t < threads; ++t) {
    streams.push_back(std::make_unique<sim::SimStream>(
        device.newCommandQueue(), t + 1, false));
    tracker.registerStream(*streams.back());
    outs.push_back(device.newBuffer(1));
  }
  const sim::BufferPtr weight = device.newBuffer(1);
  for (auto _ : state) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        sim::SimStream& s = *streams[t];
        for (int i = 0; i < kOps; ++i) {
          s.serial([&](sim::Lifecycle& lc) {
            sim::EncoderPtr enc = lc.commandEncoder();
            tracker.useInPass(s, table, weight.get(), weight_access);
            tracker.useInPass(s, table, outs[t].get(), Access::kWrite);
            enc->dispatch(
                {{{weight, sim::Access::kRead}, {outs[t], sim::Access::kWrite}},
                 nullptr});
            lc.synchronize(SyncType::COMMIT);
          });
        }
        s.synchronize(SyncType::COMMIT_AND_WAIT);
      });
    }
    for (auto& w : workers) {
      w.join();
    }
  }
  state.SetItemsProcessed(state.iterations() * threads * kOps);
}

void threadCounts(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(4)->Arg(16)->UseRealTime();
}
BENCHMARK_CAPTURE(BM_SharedWeight, RecordedAsRead, Access::kRead)
    ->Apply(threadCounts);
BENCHMARK_CAPTURE(BM_SharedWeight, RecordedAsWrite, Access::kWrite)
    ->Apply(threadCounts);

} // namespace
