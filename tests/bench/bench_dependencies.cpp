// Cost of cross-stream dependency tracking (Note [MPS cross-stream
// dependencies]): the hook on the same-stream fast path against no hook, and
// a producer -> consumer thread pipeline with automatic tracking against the
// explicit synchronize() a user would otherwise write.

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

// A stream whose marks never move: the fast path only reads openMark().
class IdleStream final : public at::mps::DependencyStream {
 public:
  IdleStream() : DependencyStream(3) {
    bindOpenMark(open_mark_);
  }
  uint64_t committedMark() const override {
    return 6;
  }
  uint64_t completedMark() const override {
    return 6;
  }
  void flushAsync(uint64_t) override {}
  void closePass(bool) override {}
  void commitOpen() override {}
  void encodeWait(DependencyStream&, uint64_t) override {}
  void waitCommitted(uint64_t) override {}
  void waitCompleted(uint64_t) override {}

 private:
  std::atomic<uint64_t> open_mark_{7};
};

// What getMTLBufferStorage() adds per buffer, out of line as there (and so
// that scripts/bench_instructions.py can count it): nothing in v2.9.1; with
// the patch, trackMPSBufferUseInPass(), which records the use (as a write,
// as there).
__attribute__((noinline)) void untrackedAccess(void* p) {
  benchmark::DoNotOptimize(p);
}
__attribute__((noinline)) void trackedAccess(
    at::mps::DependencyTracker& tracker,
    at::mps::BufferUseTable& table,
    IdleStream& stream,
    void* p) {
  tracker.useInPass(stream, table, p, Access::kWrite);
}

// Sixteen buffer identities, 64 bytes apart like distinct objects, visited
// in turn. (state.iterations() cannot pick one: it stays constant inside
// the benchmark loop.)
struct Buffers {
  alignas(64) char storage[16][64];
  size_t visits = 0;
  void* at(size_t i) {
    return storage[i];
  }
  void* next() {
    return storage[visits++ & 15];
  }
};

void BM_BufferAccess_NoHook(benchmark::State& state) {
  Buffers buffers;
  for (auto _ : state) {
    void* p = buffers.next();
    untrackedAccess(p);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_BufferAccess_NoHook);

// Lookup of the buffer's record plus the tracker's same-stream fast path,
// for a buffer only its own stream uses, in the pass that used it last.
void BM_BufferAccess_SameStreamHook(benchmark::State& state) {
  at::mps::DependencyTracker tracker;
  at::mps::BufferUseTable table;
  IdleStream stream;
  tracker.registerStream(stream);
  Buffers buffers;
  for (size_t i = 0; i < 16; ++i) { // first use of each takes the slow path
    tracker.use(
        stream, table.get(buffers.at(i)), Access::kWrite, UseSite::kInPass);
  }
  for (auto _ : state) {
    void* p = buffers.next();
    trackedAccess(tracker, table, stream, p);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_BufferAccess_SameStreamHook);

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
