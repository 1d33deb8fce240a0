// The single-thread hot paths next to their v2.9.1 models: the current
// stream lookup and a buffer access with the dependency hook's same-stream
// fast path (Note [MPS cross-stream dependencies]). Built as
// bench_hot_paths (the paths linked in) and bench_hot_paths_shared (the
// paths in a shared library, as in libtorch); see hot_paths.h.

#include <benchmark/benchmark.h>

#include "hot_paths.h"

#include <atomic>

namespace {

void BM_CurrentStream_V291Singleton(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(bench::legacyGetCurrentStream());
  }
}
BENCHMARK(BM_CurrentStream_V291Singleton)->ThreadRange(1, 2);

// Thread 0 is the main thread (default stream); others hold leases.
void BM_CurrentStream_Pool(benchmark::State& state) {
  bench::poolGetCurrentStream(); // bind outside the timed loop
  for (auto _ : state) {
    benchmark::DoNotOptimize(bench::poolGetCurrentStream());
  }
}
BENCHMARK(BM_CurrentStream_Pool)->ThreadRange(1, 2);

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

// Sixteen buffer identities, 64 bytes apart like distinct objects, visited
// in turn. (state.iterations() cannot pick one: it stays constant inside
// the benchmark loop.)
struct Buffers {
  alignas(64) char storage[16][64];
  size_t visits = 0;
  void* next() {
    return storage[visits++ & 15];
  }
};

void BM_BufferAccess_NoHook(benchmark::State& state) {
  Buffers buffers;
  for (auto _ : state) {
    void* p = buffers.next();
    bench::untrackedAccess(p);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_BufferAccess_NoHook);

// Lookup of the buffer's record plus the tracker's same-stream fast path,
// for a buffer only its own stream uses, in the pass that used it last; every
// use is `access` (a kernel's output, or an elementwise op's input).
void sameStreamHook(benchmark::State& state, at::mps::Access access) {
  at::mps::DependencyTracker tracker;
  at::mps::BufferUseTable table;
  IdleStream stream;
  tracker.registerStream(stream);
  Buffers buffers;
  for (int i = 0; i < 16; ++i) { // first use of each takes the slow path
    bench::trackedAccess(tracker, table, stream, buffers.next(), access);
  }
  for (auto _ : state) {
    void* p = buffers.next();
    bench::trackedAccess(tracker, table, stream, p, access);
    benchmark::DoNotOptimize(p);
  }
}
void BM_BufferAccess_SameStreamHook(benchmark::State& state) {
  sameStreamHook(state, at::mps::Access::kWrite);
}
BENCHMARK(BM_BufferAccess_SameStreamHook);
void BM_BufferAccess_SameStreamHookRead(benchmark::State& state) {
  sameStreamHook(state, at::mps::Access::kRead);
}
BENCHMARK(BM_BufferAccess_SameStreamHookRead);

} // namespace
