#pragma once

// Portable core of the MPS caching allocator: pools, locking, pending frees,
// stream uses and the reuse rule. No Objective-C and no Metal here: PyTorch
// gives CachingAllocatorCore a backend over MTLHeap/MTLBuffer and MPSStream,
// tests one over a simulated runtime.

#include <ATen/mps/MPSStreamPool.h>
#include <ATen/mps/MPSThreadAnnotations.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace at::mps {

// The allocator's view of the streams: each stream's commit-point timeline
// (see Note [MPS command buffer lifecycle]). PyTorch implements it over
// MPSStream, tests over a simulated stream.
//
// The allocator never calls these while holding one of its own locks, so an
// implementation may take stream locks and may run `fn` inline.
class StreamTimelines {
 public:
  virtual ~StreamTimelines() = default;
  // The commit point that will carry all work encoded on `stream` so far.
  virtual uint64_t pendingPoint(StreamIndex stream) = 0;
  // The largest n such that commit points 1..n of `stream` have completed.
  virtual uint64_t completedPoint(StreamIndex stream) = 0;
  // Asks `stream` to commit its open command buffer soon. A hint: it must not
  // block on the stream (another thread may be encoding on it).
  virtual void requestCommit(StreamIndex stream) = 0;
  // Runs `fn` once completedPoint(stream) >= value, from the completion of
  // the work that reaches it, or inline if it already has.
  virtual void onCompleted(
      StreamIndex stream,
      uint64_t value,
      std::function<void()> fn) = 0;
  // Commits what `value` needs and blocks until completedPoint(stream) >=
  // value. Used by emptyCache() and the out-of-memory path only; the caller
  // must not be inside the serial section of another stream.
  virtual void waitFor(StreamIndex stream, uint64_t value) = 0;
};

// The allocator's device memory. A buffer is an opaque handle, never null;
// key(buffer) is the pointer users free. The allocator calls these under
// its own locks (see Note [MPS allocator locking]), so they must not call
// back into the allocator or into streams.
class AllocatorBackend {
 public:
  virtual ~AllocatorBackend() = default;
  // New device memory for `pool`, or nullptr when out of memory. Calls for
  // one pool are serialised.
  virtual void* allocate(int pool, size_t size, bool memory_pressure) = 0;
  virtual void release(int pool, void* buffer) = 0;
  virtual const void* key(void* buffer) const = 0;
  // Whether the GPU may still reference the buffer; conservative.
  virtual bool gpuReferenced(void* buffer) const = 0;
  // Compared with the low watermark.
  virtual size_t deviceAllocatedSize() const = 0;
  // Before the out-of-memory retries.
  virtual void onAllocationFailed() {}
  // Appended to the out-of-memory error.
  virtual std::string outOfMemoryHint() const {
    return {};
  }
  // Resets the buffer's payload (shapes, events) when its user frees it.
  virtual void onFree(void* /*buffer*/) {}
};

// Note [MPS allocator stream-cache lock]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A stream cache is locked once by every malloc and free on the fast path,
// nearly always by its own stream's threads, for a few set operations on
// blocks that carry their own set nodes: the critical sections never block,
// allocate, or call out (but for gpuReferenced on rare release paths). A
// std::mutex costs two atomic read-modify-writes per critical section (its
// unlock must look for sleeping waiters), which alone made a single-threaded
// malloc/free pair 1.5x one under a single allocator-wide lock on large x86
// cores. This lock costs one: an exchange to acquire, a release store to
// release. A waiter spins on a plain load, then yields, then sleeps between
// tries, so a preempted holder gets to run whatever the priorities.
class MPS_THREAD_ANNOTATION(capability("mutex")) CacheLock {
 public:
  void lock() MPS_ACQUIRE() {
    for (int tries = 0; locked_.exchange(true, std::memory_order_acquire);) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++tries > 1000) {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        } else if (tries > 50) {
          std::this_thread::yield();
        }
      }
    }
  }
  void unlock() MPS_RELEASE() {
    locked_.store(false, std::memory_order_release);
  }

 private:
  std::atomic<bool> locked_{false};
};

using CacheLockGuard = ScopedLock<CacheLock>;

struct AllocatorPoolOptions {
  std::string name;
  // Whether a block freed with uses on its allocation stream only may be
  // handed to that stream again before the GPU is done with it. True for
  // hazard-tracked memory, where the queue orders the old and the new work;
  // false for untracked memory (the scalar pool) and memory the CPU writes
  // right after allocation.
  bool same_stream_reuse = true;
  // Whether the pool reacts to memory pressure (the low watermark): garbage
  // collection of old cached blocks before device allocations, and no reuse
  // of cached blocks more than `max_oversize` bytes larger than the request.
  bool pressure_aware = false;
  size_t max_oversize = SIZE_MAX;
};

// A snapshot of the allocator's counters. No update is lost under
// concurrency, and a snapshot taken while no thread is inside the allocator
// is exact; reserved_bytes and its peak are exact at every instant.
// allocated_bytes is a sum of per-stream counters, so it has no peak:
// torch.mps exposes none, and one shared counter would cost every malloc and
// free a contended cache line (see Note [MPS allocator locking]).
struct AllocatorStats {
  int64_t reserved_bytes = 0; // device memory held in blocks, any state
  int64_t allocated_bytes = 0; // in blocks handed out and not yet freed
  int64_t pending_bytes = 0; // in freed blocks waiting for other streams
  int64_t peak_reserved_bytes = 0;
  int64_t blocks = 0; // blocks that hold device memory
  uint64_t mallocs = 0;
  uint64_t frees = 0;
  uint64_t cache_hits = 0; // mallocs served from a cache, any kind
  uint64_t stream_steals = 0; // ... from another stream's cache
  uint64_t device_allocs = 0;
  uint64_t device_releases = 0;
  uint64_t gc_releases = 0;
  uint64_t oom_retries = 0; // device allocations that failed once
  uint64_t ooms = 0; // mallocs that raised out-of-memory
  uint64_t commit_requests = 0;
  uint64_t handlers_registered = 0; // completion handlers asked for
  uint64_t handlers_run = 0;
};

// Where the cached bytes are, counted by walking every container under its
// lock. For tests and debugging; not a hot path.
struct AllocatorCensus {
  int64_t stream_cached_bytes = 0; // in per-stream caches
  int64_t free_bytes = 0; // in pools' free sets
  int64_t pending_bytes = 0; // waiting on fences
  int64_t blocks = 0; // blocks in any of those
};

// Note [MPS allocator cross-stream reuse]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A block records its allocation stream A and the set of streams that used
// it: A itself plus every stream passed to recordStream(). At free(), each
// used stream S contributes a fence (S, pendingPoint(S)): the commit point
// that carries all work encoded on S so far, including every use of the
// block (the user's free happens after the user's encoding).
//
//  1. Same stream only (uses == {A}) and the pool allows it: the block goes
//     to A's stream cache and a malloc on A may take it at once. The new work
//     is encoded on A after the old, and one queue runs hazard-tracked work
//     in order, so the GPU sees the old uses finish before the new ones
//     start. This is the one-queue rule, applied per stream.
//  2. Otherwise the block is pending until every fence has completed
//     (completedPoint(S) >= value). Pending blocks are resolved by
//     completion handlers on the streams that carried the work, and lazily
//     by mallocs that miss, which read completedPoint() themselves. A
//     resolved block is free for every stream.
//  3. A block in A's cache is also free for every other stream once its
//     fence on A has completed; a malloc that misses its own cache and the
//     pool's free set takes such a block ("steals" it).
//  4. A malloc that finds nothing usable while pending blocks wait for
//     their fences asks those streams to commit (a hint; it never waits)
//     and allocates new device memory. Stream caches never trigger commits:
//     their owner reuses them without one.
//
// The contract with the user is CUDA's:
//  - A block handed out on A is ready for work on A. Work on another stream
//    B must first wait for A (an event, like wait_stream()), as for any
//    tensor produced on A: by rule 1 the block's previous life may still be
//    running on A.
//  - A block used on B must be recordStream()'d on B before it is freed.
//    The allocator cannot see unrecorded uses: without it the block may be
//    handed out on A, or on any stream once A's work is done, while B still
//    uses it.
//
// Device memory is only ever released (GC, emptyCache, OOM retries) for
// blocks whose fences have completed and that the backend reports as no
// longer referenced by the GPU, so releasing never races with GPU work.
class CachingAllocatorCore {
 public:
  using StreamMask = uint32_t;
  static_assert(
      kStreamsPerPool <= 32,
      "stream sets are 32-bit masks indexed by StreamIndex");

  struct Block;

  // Best fit by size; ties by id so that the order is deterministic. (Block
  // is complete in the bodies: they are compiled with the enclosing class.)
  struct BySize {
    using is_transparent = void; // lower_bound(size)
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->id < b->id;
    }
    bool operator()(const Block* a, size_t size) const {
      return a->size < size;
    }
  };
  using BlockSet = std::set<Block*, BySize>;

  struct Block {
    // Fixed from device allocation to release.
    void* buffer = nullptr;
    size_t size = 0;
    int pool = 0;
    uint64_t id = 0;
    // Owner-visible state; see Note [MPS allocator block ownership].
    std::atomic<bool> active{false};
    StreamIndex stream = kDefaultStreamIndex; // allocation stream
    StreamMask uses = 0; // includes `stream`
    // Cache state, guarded by the container that holds the block.
    uint64_t fence = 0; // stream cache: pendingPoint(stream) at free
    int64_t cached_at = 0; // when freed (steady_clock ticks), for GC ages
    int outstanding = 0; // pending: fences not yet completed
    // The set node that held the block when it last left a BlockSet, kept
    // for its next insertion so that caching a block allocates nothing.
    // Empty while the block is in a set; owned like the cache state.
    BlockSet::node_type node;
  };

  CachingAllocatorCore(
      AllocatorBackend& backend,
      StreamTimelines& timelines,
      std::vector<AllocatorPoolOptions> pools);
  // Releases every block that is not handed out. Streams must be idle (no
  // completion handler of this allocator may still run); blocks still
  // handed out are leaked, as their owners may free them at process exit.
  ~CachingAllocatorCore();

  // Hands out the buffer of a block of `size` bytes (already rounded by the
  // caller) from `pool` for use on `stream`. Raises "MPS backend out of
  // memory" when the device has no memory left after every retry.
  void* malloc(int pool, size_t size, StreamIndex stream);
  // Returns the block `key` to the allocator;
  // see Note [MPS allocator cross-stream reuse].
  void free(const void* key);
  // Records that work on `stream` uses the block `key`, so that free() waits
  // for it (CUDA's recordStream).
  void recordStream(const void* key, StreamIndex stream);

  // Runs fn(buffer) under the shard lock of block `key`, with its buffer
  // as a `Buffer*`, or nullptr when `key` is not a block of this allocator
  // (handed out or cached).
  template <typename Buffer = void, typename Fn>
  decltype(auto) withBuffer(const void* key, Fn&& fn) {
    Shard& shard = shardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.blocks.find(key);
    return fn(
        it == shard.blocks.end() ? nullptr
                                 : static_cast<Buffer*>(it->second->buffer));
  }

  // Waits for the work that cached blocks wait on, then releases every
  // cached block. Blocks freed while it runs may stay cached.
  void emptyCache();
  // Moves pending blocks whose fences have completed to their pools' free sets.
  void resolvePending();
  // Device bytes at or above which pressure-aware pools collect garbage and
  // avoid oversized reuse; 0 disables it.
  void setLowWatermark(size_t bytes) {
    low_watermark_.store(bytes);
  }
  AllocatorStats stats() const;
  AllocatorCensus census();

 private:
  struct alignas(64) StreamCache {
    // See Note [MPS allocator stream-cache lock].
    mutable CacheLock mu;
    BlockSet blocks MPS_GUARDED_BY(mu);
    // Events of the fast path, counted under the lock it holds anyway:
    // mallocs this cache served, frees it took.
    uint64_t hits MPS_GUARDED_BY(mu) = 0;
    uint64_t frees MPS_GUARDED_BY(mu) = 0;
    int64_t allocated_bytes MPS_GUARDED_BY(mu) = 0;
  };

  struct Pool {
    Pool(int i, AllocatorPoolOptions o) : index(i), options(std::move(o)) {}
    const int index;
    const AllocatorPoolOptions options;
    Mutex mu MPS_ACQUIRED_BEFORE(StreamCache::mu);
    // Blocks free for every stream.
    BlockSet free_blocks MPS_GUARDED_BY(mu);
    // Pending blocks, as (pendingPoint at free -> block) per used stream; a
    // block leaves when its last fence completes.
    std::array<std::multimap<uint64_t, Block*>, kStreamsPerPool> fences
        MPS_GUARDED_BY(mu);
    // Streams with fences here / with a possibly non-empty cache. Read
    // without a lock to skip work; exact under the corresponding locks.
    std::atomic<StreamMask> pending_streams{0};
    std::atomic<StreamMask> cached_streams{0};
    std::array<StreamCache, kStreamsPerPool> caches;
  };

  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    Mutex mu MPS_ACQUIRED_AFTER(StreamCache::mu);
    // Every block that holds device memory, by key, handed out or not.
    std::unordered_map<const void*, Block*> blocks MPS_GUARDED_BY(mu);
  };

  using StreamPoints = std::array<uint64_t, kStreamsPerPool>;

  Shard& shardFor(const void* key);
  Block* activeBlockLocked(Shard& shard, const void* key, const char* op)
      MPS_REQUIRES(shard.mu);
  std::optional<size_t> overLowWatermark() const;
  uint64_t refreshCompleted(StreamIndex s);
  Block* findCached(Pool& p, size_t size, StreamIndex stream, bool pressure);
  Block* steal(Pool& p, size_t size, StreamIndex stream, size_t max_oversize);
  void lastFences(Pool& p, StreamPoints& points);
  bool resolveLocked(Pool& p, StreamIndex s, uint64_t done) MPS_REQUIRES(p.mu);
  bool resolvePool(Pool& p);
  void armOrResolve(Pool& p, StreamIndex s, uint64_t value);
  void onStreamCompleted(StreamIndex s, uint64_t value);
  Block* allocateFromDevice(Pool& p, size_t size, bool pressure);
  Block* allocateBlock(Pool& p, size_t size, StreamIndex stream, bool pressure);
  size_t releaseCompleted(Pool& p, size_t target, bool oldest_first = false);
  void releaseBlocks(Pool& p, const std::vector<Block*>& victims);

  AllocatorBackend& backend_;
  StreamTimelines& timelines_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::array<Shard, kShards> shards_;

  // Per stream: the largest commit point known complete, the largest one a
  // completion handler was registered for, and the largest one a commit
  // was requested for.
  std::array<std::atomic<uint64_t>, kStreamsPerPool> completed_{};
  std::array<std::atomic<uint64_t>, kStreamsPerPool> armed_{};
  std::array<std::atomic<uint64_t>, kStreamsPerPool> commit_requested_{};

  std::atomic<size_t> low_watermark_{0};
  std::atomic<uint64_t> next_block_id_{0};

  alignas(64) std::atomic<int64_t> reserved_bytes_{0};
  std::atomic<int64_t> peak_reserved_bytes_{0};
  std::atomic<int64_t> pending_bytes_{0};
  std::atomic<int64_t> blocks_{0};
  std::atomic<uint64_t> device_allocs_{0};
  std::atomic<uint64_t> device_releases_{0};
  std::atomic<uint64_t> gc_releases_{0};
  std::atomic<uint64_t> oom_retries_{0};
  std::atomic<uint64_t> ooms_{0};
  std::atomic<uint64_t> commit_requests_{0};
  std::atomic<uint64_t> handlers_registered_{0};
  std::atomic<uint64_t> handlers_run_{0};
  // Events off the stream-cache fast path; a malloc there is a cache hit or a
  // device allocation.
  std::atomic<int64_t> other_allocated_bytes_{0};
  std::atomic<uint64_t> other_frees_{0};
  std::atomic<uint64_t> other_hits_{0};
  std::atomic<uint64_t> stream_steals_{0};
};

} // namespace at::mps
