// malloc/free pairs from N threads, each on its own stream:
//
//  - PerPool: the portable CachingAllocatorCore (per-pool and per-stream
//    cache mutexes, sharded block table, atomic statistics).
//  - V291Model: v2.9.1's MPSHeapAllocatorImpl hot path as a model: one
//    std::recursive_mutex around a best-fit set per pool and a pointer ->
//    block hash map, as in malloc()/free() there.
//
// Both get device memory from the same trivial backend (unique fake
// addresses, never released), so the numbers compare locking and
// bookkeeping only. Each thread allocates and frees kLive blocks per
// iteration, cycling through small-pool sizes; items = malloc/free pairs.

#include <benchmark/benchmark.h>

#include <ATen/mps/MPSAllocatorCore.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr int kLive = 4;
constexpr std::array<size_t, 4> kSizes = {4096, 16384, 65536, 262144};

// PyTorch processes are multi-threaded. glibc (2.34 and later) skips the
// atomic instructions of pthread_mutex_lock/unlock until a process first
// creates a thread, so without this the first benchmarks to run (V291Model
// at 1 thread, or both variants under --benchmark_filter='threads:1$') would
// lock without a single atomic read-modify-write, and a variant running after
// any multi-threaded benchmark would pay them: the ratio would depend on the
// filter.
[[maybe_unused]] const bool multi_threaded = [] {
  std::thread([] {}).join();
  return true;
}();

// Unique, never-dereferenced addresses.
std::atomic<uintptr_t> next_address{0x10000};
void* newAddress() {
  return reinterpret_cast<void*>(next_address.fetch_add(4096));
}

class BenchBackend : public at::mps::AllocatorBackend {
 public:
  void* allocate(int, size_t, bool) override {
    return newAddress();
  }
  void release(int, void*) override {}
  const void* key(void* buffer) const override {
    return buffer;
  }
  bool gpuReferenced(void*) const override {
    return false;
  }
  size_t deviceAllocatedSize() const override {
    return 0;
  }
  std::string outOfMemoryHint() const override {
    return {};
  }
};

// Streams whose work is always complete: the benchmark measures the
// allocator, not the GPU.
class IdleTimelines : public at::mps::StreamTimelines {
 public:
  uint64_t pendingPoint(at::mps::StreamIndex) override {
    return 0;
  }
  uint64_t completedPoint(at::mps::StreamIndex) override {
    return 0;
  }
  void requestCommit(at::mps::StreamIndex) override {}
  void onCompleted(at::mps::StreamIndex, uint64_t, std::function<void()> fn)
      override {
    fn();
  }
  void waitFor(at::mps::StreamIndex, uint64_t) override {}
};

class PerPool {
 public:
  PerPool() : core_(backend_, timelines_, pools()) {}
  // Out of line, so that scripts/bench_instructions.py can count them, and
  // with no tail call into the core, which callgrind would not count as
  // part of them.
  __attribute__((noinline)) void* malloc(
      size_t size,
      at::mps::StreamIndex stream) {
    void* buffer = core_.malloc(0, size, stream);
    benchmark::DoNotOptimize(buffer);
    return buffer;
  }
  __attribute__((noinline)) void free(void* p) {
    core_.free(p);
    benchmark::ClobberMemory();
  }

 private:
  static std::vector<at::mps::AllocatorPoolOptions> pools() {
    std::vector<at::mps::AllocatorPoolOptions> p(3);
    p[0].name = "small";
    p[1].name = "large";
    p[1].pressure_aware = true;
    p[2].name = "scalar";
    p[2].same_stream_reuse = false;
    return p;
  }
  BenchBackend backend_;
  IdleTimelines timelines_;
  at::mps::CachingAllocatorCore core_;
};

// v2.9.1's structure: every call under one recursive mutex.
class V291Model {
 public:
  __attribute__((noinline)) void* malloc(size_t size, at::mps::StreamIndex) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    Pool& pool = pools_[0];
    Block* block = nullptr;
    auto it = pool.available.lower_bound(Key{size, nullptr});
    if (it != pool.available.end()) {
      block = it->second;
      pool.available.erase(it);
      pool.available_size -= block->size;
    } else {
      block = new Block{newAddress(), size, false};
      allocated_.emplace(block->buffer, block);
      pool.allocated_size += size;
      total_allocated_ += size;
    }
    block->in_use = true;
    current_allocated_ += block->size;
    return block->buffer;
  }
  __attribute__((noinline)) void free(void* p) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    Block* block = allocated_.at(p);
    Pool& pool = pools_[0];
    pool.available.emplace(Key{block->size, block->buffer}, block);
    pool.available_size += block->size;
    current_allocated_ -= block->size;
    block->in_use = false;
  }

 private:
  struct Block {
    void* buffer;
    size_t size;
    bool in_use;
  };
  struct Key {
    size_t size;
    void* buffer;
    bool operator<(const Key& o) const {
      return size != o.size ? size < o.size : buffer < o.buffer;
    }
  };
  struct Pool {
    std::map<Key, Block*> available;
    size_t allocated_size = 0;
    size_t available_size = 0;
  };
  std::recursive_mutex mutex_;
  std::unordered_map<const void*, Block*> allocated_;
  std::array<Pool, 5> pools_;
  size_t total_allocated_ = 0;
  size_t current_allocated_ = 0;
};

template <typename Allocator>
Allocator& instance() {
  static auto* a = new Allocator(); // leaked: outlives benchmark threads
  return *a;
}

template <typename Allocator>
void BM_MallocFree(benchmark::State& state) {
  Allocator& a = instance<Allocator>();
  const auto stream =
      static_cast<at::mps::StreamIndex>(1 + state.thread_index() % 31);
  std::array<void*, kLive> live{};
  size_t round = 0;
  for (auto _ : state) {
    for (int i = 0; i < kLive; ++i) {
      live[i] = a.malloc(kSizes[(round + i) % kSizes.size()], stream);
    }
    for (int i = 0; i < kLive; ++i) {
      a.free(live[i]);
    }
    ++round;
  }
  state.SetItemsProcessed(state.iterations() * kLive);
}

BENCHMARK_TEMPLATE(BM_MallocFree, V291Model)->ThreadRange(1, 16)->UseRealTime();
BENCHMARK_TEMPLATE(BM_MallocFree, PerPool)->ThreadRange(1, 16)->UseRealTime();

} // namespace
