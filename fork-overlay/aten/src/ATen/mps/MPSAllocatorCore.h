#pragma once

// Portable core of the MPS caching allocator: pools, locking, pending frees,
// stream uses and the reuse rule. No Objective-C and no Metal here: PyTorch
// instantiates CachingAllocatorCore with a backend over MTLHeap/MTLBuffer and
// MPSStream, the harness with the simulated runtime, from this same file.

#include <ATen/mps/MPSStreamPool.h>
#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace at::mps {

// The allocator's view of the streams: each stream's commit-point timeline
// (see Note [MPS command buffer lifecycle]). PyTorch implements it over
// MPSStream, the harness over SimStream.
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

// Per-pool configuration.
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

// A snapshot of the allocator's counters. Every update is an atomic
// read-modify-write or made under a lock, so none is lost under concurrency,
// and a snapshot taken while no thread is inside the allocator is exact.
// reserved_bytes and its peak are single atomics, exact at every instant.
// allocated_bytes is a sum of per-stream counters (see Note [MPS allocator
// locking]), so it has no peak: v2.9.1 exposes none, and one shared counter
// would cost every malloc and free a contended cache line.
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
//     start. This is v2.9.1's rule, now per stream.
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

// Note [MPS allocator locking]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// No global lock. Each pool has
//   Pool::mu         its free set, its pending fences, and the backend's
//                    device allocations and releases for that pool;
//   StreamCache::mu  one per (pool, stream): that stream's cached blocks;
// and the allocated-block table is split into shards by pointer:
//   Shard::mu        its pointer -> block map and the owner-visible state of
//                    those blocks (uses, active flag, backend payload).
// Lock order: Pool::mu, then StreamCache::mu, then Shard::mu (declared with
// MPS_ACQUIRED_BEFORE/AFTER; Clang checks it with -Wthread-safety-beta).
// Today no path holds two of them at once: blocks move between containers
// by being taken out under one lock and put in under the next, and while in
// transit they belong to the moving thread alone.
//
// No allocator lock is held while calling StreamTimelines: stream calls may
// take stream locks or wait for the GPU, and completion handlers take pool
// locks, so holding a pool lock across one could deadlock. Backend calls run
// under allocator locks (allocate and release under the pool's mutex, which
// serialises them per pool; gpuReferenced under a pool or cache mutex) and
// must not call back into the allocator or into streams.
//
// Statistics: device-memory counts are atomics (they change on the slow path
// only). What the fast path changes (in-use bytes, malloc and free counts)
// is counted in the stream cache, under the lock it holds anyway, and in
// atomics on the other paths; stats() sums them. A block freed into another
// counter than the one its malloc used leaves each counter off by its size,
// but never the sum.

// Note [MPS allocator block ownership]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A block is always owned by exactly one party, and its fields are accessed
// only by that owner:
//  - active (handed out): the user. `requested_size`, `stream` and `uses`
//    are written by the malloc that hands it out before the user sees the
//    pointer; `uses` and `data` change only under the block's shard mutex
//    (recordStream, withBlock), which free() also takes.
//  - cached (a stream cache, a pool's free set or its pending fences): that
//    container, under its mutex (`fence`, `cached_at`, `outstanding`).
//  - in transit between the two: the thread moving it.
// `active` itself is a relaxed atomic so that a double free is diagnosed
// without a data race.

// Backend requirements (a type, not an interface, so calls inline):
//   using Buffer;     copyable device-memory handle; Buffer{} is "none" and
//                     converts to false
//   using BlockData;  per-block payload, default-constructible
//   Buffer allocate(int pool, size_t size, bool memory_pressure,
//                   BlockData& data);     Buffer{} when out of memory
//   void release(int pool, const Buffer& buffer, BlockData& data);
//   const void* key(const Buffer& buffer) const;  the pointer users free
//   bool gpuReferenced(const Buffer& buffer) const;  conservative
//   size_t deviceAllocatedSize() const;   compared with the low watermark
//   void onAllocationFailed();            before the out-of-memory retries
//   std::string outOfMemoryHint() const;  appended to the out-of-memory error
template <typename Backend>
class CachingAllocatorCore {
 public:
  using Buffer = typename Backend::Buffer;
  using BlockData = typename Backend::BlockData;
  using StreamMask = uint32_t;
  static_assert(
      kStreamsPerPool <= 32,
      "stream sets are 32-bit masks indexed by StreamIndex");

  struct Block;

 private:
  // Best fit by size; ties by id so that the order is deterministic.
  struct BySize {
    using is_transparent = void;
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->id < b->id;
    }
    bool operator()(const Block* a, size_t size) const {
      return a->size < size;
    }
    bool operator()(size_t size, const Block* b) const {
      return size < b->size;
    }
  };
  using BlockSet = std::set<Block*, BySize>;

 public:
  struct Block {
    // Fixed from device allocation to release.
    Buffer buffer{};
    size_t size = 0;
    int pool = 0;
    uint64_t id = 0;
    // Owner-visible state; see Note [MPS allocator block ownership].
    std::atomic<bool> active{false};
    size_t requested_size = 0;
    StreamIndex stream = kDefaultStreamIndex; // allocation stream
    StreamMask uses = 0; // includes `stream`
    BlockData data{};
    // Cache state, guarded by the container that holds the block.
    uint64_t fence = 0; // stream cache: pendingPoint(stream) at free
    int64_t cached_at = 0; // when freed (ns), for GC ages
    int outstanding = 0; // pending: fences not yet completed
    // The set node that held the block when it last left a BlockSet, kept
    // for its next insertion so that caching a block allocates nothing.
    // Empty while the block is in a set; owned like the cache state.
    typename BlockSet::node_type node;
  };

  CachingAllocatorCore(
      Backend& backend,
      StreamTimelines& timelines,
      std::vector<AllocatorPoolOptions> pools)
      : backend_(backend), timelines_(timelines) {
    TORCH_CHECK(!pools.empty(), "CachingAllocatorCore: `pools` is empty");
    for (size_t i = 0; i < pools.size(); ++i) {
      pools_.push_back(
          std::make_unique<Pool>(static_cast<int>(i), std::move(pools[i])));
    }
  }

  // Releases every block that is not handed out. Streams must be idle (no
  // completion handler of this allocator may still run); blocks still
  // handed out are leaked, as their owners may free them at process exit.
  ~CachingAllocatorCore() {
    std::vector<std::vector<Block*>> idle(pools_.size());
    for (auto& shard : shards_) {
      MutexLock lock(shard.mu);
      for (auto& [key, b] : shard.blocks) {
        if (!b->active.load(std::memory_order_relaxed)) {
          idle[b->pool].push_back(b);
        }
      }
    }
    for (auto& p : pools_) {
      releaseBlocks(*p, idle[p->index]);
    }
  }
  CachingAllocatorCore(const CachingAllocatorCore&) = delete;
  CachingAllocatorCore& operator=(const CachingAllocatorCore&) = delete;

  // Hands out a block of `size` bytes (already rounded by the caller) from
  // `pool` for use on `stream`. Raises "MPS backend out of memory" when the
  // device has no memory left after every retry.
  Buffer malloc(
      int pool,
      size_t size,
      size_t requested_size,
      StreamIndex stream) {
    checkPool(pool, "pool");
    checkStream(stream, "stream");
    TORCH_CHECK(size > 0, "MPS allocator: malloc() of size 0");
    Pool& p = *pools_[pool];
    const bool pressure = p.options.pressure_aware && memoryPressure();
    bool own_cache = false;
    Block* b = findCached(p, size, stream, pressure, &own_cache);
    const bool fresh = b == nullptr;
    if (fresh) {
      b = allocateBlock(p, size, stream, pressure, &own_cache);
    }
    if (!own_cache) {
      other_mallocs_.fetch_add(1, std::memory_order_relaxed);
      other_allocated_bytes_.fetch_add(
          static_cast<int64_t>(b->size), std::memory_order_relaxed);
    }
    activate(*b, requested_size, stream, fresh);
    return b->buffer;
  }

  // Returns the block `key` to the allocator; see Note [MPS allocator
  // cross-stream reuse]. `on_free(block)` runs under the block's shard lock
  // first (to reset backend payload such as shapes).
  template <typename OnFree>
  void free(const void* key, OnFree&& on_free) {
    Block* b = nullptr;
    StreamIndex stream = kDefaultStreamIndex;
    StreamMask uses = 0;
    {
      Shard& shard = shardFor(key);
      MutexLock lock(shard.mu);
      b = activeBlockLocked(shard, key, "free()");
      on_free(*b);
      b->active.store(false, std::memory_order_relaxed);
      stream = b->stream;
      uses = b->uses;
    }
    Pool& p = *pools_[b->pool];
    const size_t size = b->size;
    const int64_t now = p.options.pressure_aware ? nowNs() : 0;

    if (uses == bit(stream) && p.options.same_stream_reuse) {
      const uint64_t fence = timelines_.pendingPoint(stream);
      StreamCache& cache = p.caches[stream];
      MutexLock lock(cache.mu);
      b->fence = fence;
      b->cached_at = now;
      insertBlock(cache.blocks, b);
      ++cache.frees;
      cache.allocated_bytes -= static_cast<int64_t>(size);
      if (!(p.cached_streams.load() & bit(stream))) {
        p.cached_streams.fetch_or(bit(stream));
      }
      return;
    }

    std::array<uint64_t, kStreamsPerPool> points{};
    for (StreamIndex s : streamsIn(uses)) {
      points[s] = timelines_.pendingPoint(s);
    }
    other_frees_.fetch_add(1, std::memory_order_relaxed);
    other_allocated_bytes_.fetch_sub(
        static_cast<int64_t>(size), std::memory_order_relaxed);
    {
      MutexLock lock(p.mu);
      b->cached_at = now;
      b->outstanding = 0;
      for (StreamIndex s : streamsIn(uses)) {
        p.fences[s].emplace(points[s], b);
        ++b->outstanding;
      }
      p.pending_streams.fetch_or(uses);
      pending_bytes_.fetch_add(static_cast<int64_t>(size));
    }
    // `b` may be resolved and handed out again from here on; only the
    // fences are used below.
    for (StreamIndex s : streamsIn(uses)) {
      armOrResolve(p, s, points[s]);
    }
  }
  void free(const void* key) {
    free(key, [](Block&) {});
  }

  // Records that work on `stream` uses the block `key`, so that free() waits
  // for it (CUDA's recordStream).
  void recordStream(const void* key, StreamIndex stream) {
    checkStream(stream, "stream");
    Shard& shard = shardFor(key);
    MutexLock lock(shard.mu);
    activeBlockLocked(shard, key, "recordStream()")->uses |= bit(stream);
  }

  // Runs fn(block) under the block's shard lock, with nullptr when `key`
  // is not a block of this allocator (handed out or cached).
  template <typename Fn>
  decltype(auto) withBlock(const void* key, Fn&& fn) {
    Shard& shard = shardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.blocks.find(key);
    return fn(it == shard.blocks.end() ? nullptr : it->second);
  }

  // Waits for the work that cached blocks wait on, then releases every
  // cached block. Blocks freed while it runs may stay cached.
  void emptyCache() {
    std::array<uint64_t, kStreamsPerPool> need{};
    for (auto& p : pools_) {
      {
        MutexLock lock(p->mu);
        for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
          if (!p->fences[s].empty()) {
            need[s] = std::max(need[s], p->fences[s].rbegin()->first);
          }
        }
      }
      for (StreamIndex s : streamsIn(p->cached_streams.load())) {
        StreamCache& cache = p->caches[s];
        MutexLock lock(cache.mu);
        for (Block* b : cache.blocks) {
          need[s] = std::max(need[s], b->fence);
        }
      }
    }
    for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
      if (need[s] > completed_[s].load() && refreshCompleted(s) < need[s]) {
        timelines_.waitFor(s, need[s]);
        raiseMax(completed_[s], need[s]);
      }
    }
    for (auto& p : pools_) {
      releaseCompleted(*p, SIZE_MAX);
    }
  }

  // Moves pending blocks whose fences have completed to their pools' free
  // sets (v2.9.1's freeInactiveBuffers).
  void resolvePending() {
    for (auto& p : pools_) {
      resolvePool(*p);
    }
  }

  // Device bytes at or above which pressure-aware pools collect garbage and
  // avoid oversized reuse; 0 disables it.
  void setLowWatermark(size_t bytes) {
    low_watermark_.store(bytes);
  }
  size_t lowWatermark() const {
    return low_watermark_.load();
  }

  AllocatorStats stats() const {
    AllocatorStats s;
    s.reserved_bytes = reserved_bytes_.load();
    s.allocated_bytes = other_allocated_bytes_.load();
    s.pending_bytes = pending_bytes_.load();
    s.peak_reserved_bytes = peak_reserved_bytes_.load();
    s.blocks = blocks_.load();
    s.mallocs = other_mallocs_.load();
    s.frees = other_frees_.load();
    s.cache_hits = other_hits_.load();
    s.stream_steals = stream_steals_.load();
    for (const auto& p : pools_) {
      for (auto& cache : p->caches) {
        MutexLock lock(cache.mu);
        s.mallocs += cache.hits;
        s.cache_hits += cache.hits;
        s.frees += cache.frees;
        s.allocated_bytes += cache.allocated_bytes;
      }
    }
    s.device_allocs = device_allocs_.load();
    s.device_releases = device_releases_.load();
    s.gc_releases = gc_releases_.load();
    s.oom_retries = oom_retries_.load();
    s.ooms = ooms_.load();
    s.commit_requests = commit_requests_.load();
    s.handlers_registered = handlers_registered_.load();
    s.handlers_run = handlers_run_.load();
    return s;
  }

  AllocatorCensus census() {
    AllocatorCensus c;
    for (auto& p : pools_) {
      {
        MutexLock lock(p->mu);
        for (Block* b : p->free_blocks) {
          c.free_bytes += static_cast<int64_t>(b->size);
          ++c.blocks;
        }
        std::set<Block*> pending;
        for (const auto& fences : p->fences) {
          for (const auto& [value, b] : fences) {
            pending.insert(b);
          }
        }
        for (Block* b : pending) {
          c.pending_bytes += static_cast<int64_t>(b->size);
          ++c.blocks;
        }
      }
      for (auto& cache : p->caches) {
        MutexLock lock(cache.mu);
        for (Block* b : cache.blocks) {
          c.stream_cached_bytes += static_cast<int64_t>(b->size);
          ++c.blocks;
        }
      }
    }
    return c;
  }

  size_t poolCount() const {
    return pools_.size();
  }
  const AllocatorPoolOptions& poolOptions(int pool) const {
    checkPool(pool, "pool");
    return pools_[pool]->options;
  }

 private:
  struct alignas(64) StreamCache {
    mutable Mutex mu;
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

  static StreamMask bit(StreamIndex s) {
    return StreamMask{1} << s;
  }
  // `for (StreamIndex s : streamsIn(mask))` visits the set bits in order.
  struct StreamRange {
    struct Iterator {
      StreamMask rest;
      StreamIndex operator*() const {
        return static_cast<StreamIndex>(__builtin_ctz(rest));
      }
      Iterator& operator++() {
        rest &= rest - 1;
        return *this;
      }
      bool operator!=(const Iterator& other) const {
        return rest != other.rest;
      }
    };
    StreamMask mask;
    Iterator begin() const {
      return {mask};
    }
    Iterator end() const {
      return {0};
    }
  };
  static StreamRange streamsIn(StreamMask mask) {
    return {mask};
  }
  static void raiseMax(std::atomic<uint64_t>& a, uint64_t v) {
    uint64_t cur = a.load();
    while (v > cur && !a.compare_exchange_weak(cur, v)) {
    }
  }
  static void raiseMax(std::atomic<int64_t>& a, int64_t v) {
    int64_t cur = a.load(std::memory_order_relaxed);
    while (v > cur && !a.compare_exchange_weak(cur, v)) {
    }
  }
  static std::string formatBytes(int64_t bytes) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB"};
    double value = static_cast<double>(bytes);
    int unit = 0;
    while (unit < 3 && (value >= 1024.0 || value <= -1024.0)) {
      value /= 1024.0;
      ++unit;
    }
    char text[32];
    std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
    return text;
  }
  static int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void checkPool(int pool, const char* arg) const {
    TORCH_CHECK(
        pool >= 0 && static_cast<size_t>(pool) < pools_.size(),
        "MPS allocator: ",
        arg,
        "=",
        pool,
        " is out of range, expected 0 <= ",
        arg,
        " < ",
        pools_.size());
  }
  static void checkStream(StreamIndex stream, const char* arg) {
    TORCH_CHECK(
        stream >= 0 && stream < kStreamsPerPool,
        "MPS allocator: ",
        arg,
        "=",
        stream,
        " is not a stream index, expected 0 <= ",
        arg,
        " < ",
        kStreamsPerPool);
  }

  Shard& shardFor(const void* key) {
    auto h = reinterpret_cast<uintptr_t>(key);
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    return shards_[(h >> 32) % kShards];
  }

  bool memoryPressure() const {
    const size_t low = low_watermark_.load(std::memory_order_relaxed);
    return low != 0 && backend_.deviceAllocatedSize() >= low;
  }

  // The stream's completed point, read now; also raises the cached value.
  uint64_t refreshCompleted(StreamIndex s) {
    const uint64_t done = timelines_.completedPoint(s);
    raiseMax(completed_[s], done);
    return std::max(done, completed_[s].load());
  }

  // Inserts `b`, reusing the node it was last extracted with.
  static void insertBlock(BlockSet& set, Block* b) {
    if (b->node) {
      set.insert(std::move(b->node));
    } else {
      set.insert(b);
    }
  }

  // First block in `set` that fits `size` and satisfies `usable`, removed.
  template <typename Usable>
  static Block* takeFit(
      BlockSet& set,
      size_t size,
      bool pressure,
      size_t max_oversize,
      Usable&& usable) {
    for (auto it = set.lower_bound(size); it != set.end(); ++it) {
      Block* b = *it;
      if (pressure && b->size - size > max_oversize) {
        return nullptr; // sorted: every later block is larger still
      }
      if (usable(b)) {
        b->node = set.extract(it);
        return b;
      }
    }
    return nullptr;
  }

  // `*own_cache` tells whether the block came from the stream's own cache
  // (counted there).
  Block* findCached(
      Pool& p,
      size_t size,
      StreamIndex stream,
      bool pressure,
      bool* own_cache) {
    const auto any = [](const Block*) { return true; };
    if (p.options.same_stream_reuse) {
      StreamCache& cache = p.caches[stream];
      MutexLock lock(cache.mu);
      if (Block* b = takeFit(
              cache.blocks, size, pressure, p.options.max_oversize, any)) {
        ++cache.hits;
        cache.allocated_bytes += static_cast<int64_t>(b->size);
        *own_cache = true;
        return b;
      }
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      {
        MutexLock lock(p.mu);
        if (Block* b = takeFit(
                p.free_blocks, size, pressure, p.options.max_oversize, any)) {
          other_hits_.fetch_add(1, std::memory_order_relaxed);
          return b;
        }
      }
      if (attempt == 0 && !resolvePool(p)) {
        break;
      }
    }
    return steal(p, size, stream, pressure);
  }

  // A block from another stream's cache whose fence has completed.
  Block* steal(Pool& p, size_t size, StreamIndex stream, bool pressure) {
    Block* found = nullptr;
    for (StreamIndex s : streamsIn(p.cached_streams.load() & ~bit(stream))) {
      const uint64_t done = refreshCompleted(s);
      StreamCache& cache = p.caches[s];
      MutexLock lock(cache.mu);
      if (cache.blocks.empty()) {
        p.cached_streams.fetch_and(~bit(s));
        continue;
      }
      found = takeFit(
          cache.blocks,
          size,
          pressure,
          p.options.max_oversize,
          [&](const Block* b) { return b->fence <= done; });
      if (found) {
        break;
      }
    }
    if (found) {
      other_hits_.fetch_add(1, std::memory_order_relaxed);
      stream_steals_.fetch_add(1, std::memory_order_relaxed);
    }
    return found;
  }

  // Pops the fences of stream `s` that `done` covers; a block whose last
  // fence goes becomes free. Returns whether any block did.
  // The handed-out block `key`; raises an error naming `op` otherwise.
  Block* activeBlockLocked(Shard& shard, const void* key, const char* op)
      MPS_REQUIRES(shard.mu) {
    auto it = shard.blocks.find(key);
    TORCH_CHECK(
        it != shard.blocks.end() &&
            it->second->active.load(std::memory_order_relaxed),
        "MPS allocator: ",
        op,
        " of a pointer that is not an allocated block (double free, or "
        "memory from another allocator): ptr=",
        key);
    return it->second;
  }

  bool resolveLocked(Pool& p, StreamIndex s, uint64_t done) MPS_REQUIRES(p.mu) {
    auto& fences = p.fences[s];
    bool freed = false;
    const auto end = fences.upper_bound(done);
    for (auto it = fences.begin(); it != end; ++it) {
      Block* b = it->second;
      if (--b->outstanding == 0) {
        insertBlock(p.free_blocks, b);
        pending_bytes_.fetch_sub(static_cast<int64_t>(b->size));
        freed = true;
      }
    }
    fences.erase(fences.begin(), end);
    if (fences.empty()) {
      p.pending_streams.fetch_and(~bit(s));
    }
    return freed;
  }

  // Lazy resolution: reads the completed points of the streams this pool
  // has fences on (outside the lock), then resolves.
  bool resolvePool(Pool& p) {
    const StreamMask mask = p.pending_streams.load();
    if (!mask) {
      return false;
    }
    for (StreamIndex s : streamsIn(mask)) {
      refreshCompleted(s);
    }
    MutexLock lock(p.mu);
    bool freed = false;
    for (StreamIndex s : streamsIn(mask)) {
      freed |= resolveLocked(p, s, completed_[s].load());
    }
    return freed;
  }

  // After inserting fence (s, value) into `p`: makes sure a completion
  // handler will resolve it. One handler per stream covers every fence up
  // to its value, so a new one is registered only for a larger value. The
  // handler publishes its value before sweeping, so a fence inserted after
  // its sweep of `p` sees the value here and is resolved by this thread.
  void armOrResolve(Pool& p, StreamIndex s, uint64_t value) {
    uint64_t armed = armed_[s].load();
    while (value > armed) {
      if (armed_[s].compare_exchange_weak(armed, value)) {
        handlers_registered_.fetch_add(1);
        timelines_.onCompleted(
            s, value, [this, s, value] { onStreamCompleted(s, value); });
        return;
      }
    }
    const uint64_t done = completed_[s].load();
    if (value <= done) {
      MutexLock lock(p.mu);
      resolveLocked(p, s, done);
    }
  }

  void onStreamCompleted(StreamIndex s, uint64_t value) {
    raiseMax(completed_[s], value);
    for (auto& p : pools_) {
      if (p->pending_streams.load() & bit(s)) {
        MutexLock lock(p->mu);
        resolveLocked(*p, s, completed_[s].load());
      }
    }
    handlers_run_.fetch_add(1);
  }

  // Asks the streams that hold fences in `p` to commit, at most once per
  // fence value.
  void requestCommits(Pool& p) {
    std::array<uint64_t, kStreamsPerPool> wanted{};
    {
      MutexLock lock(p.mu);
      for (StreamIndex s : streamsIn(p.pending_streams.load())) {
        if (!p.fences[s].empty()) {
          wanted[s] = p.fences[s].rbegin()->first;
        }
      }
    }
    for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
      uint64_t requested = commit_requested_[s].load();
      while (wanted[s] > requested && wanted[s] > completed_[s].load()) {
        if (commit_requested_[s].compare_exchange_weak(requested, wanted[s])) {
          commit_requests_.fetch_add(1);
          timelines_.requestCommit(s);
          break;
        }
      }
    }
  }

  Block* allocateFromDevice(Pool& p, size_t size, bool pressure) {
    auto b = std::make_unique<Block>();
    {
      MutexLock lock(p.mu);
      b->buffer = backend_.allocate(p.index, size, pressure, b->data);
    }
    if (!b->buffer) {
      return nullptr;
    }
    b->size = size;
    b->pool = p.index;
    b->id = next_block_id_.fetch_add(1) + 1;
    const auto bytes = static_cast<int64_t>(size);
    raiseMax(peak_reserved_bytes_, reserved_bytes_.fetch_add(bytes) + bytes);
    blocks_.fetch_add(1);
    device_allocs_.fetch_add(1);
    return b.release();
  }

  // The miss path: commit hints, garbage collection, device allocation and
  // v2.9.1's out-of-memory ladder (callbacks and cache, this pool's cached
  // blocks, then every cached block after waiting for its streams).
  Block* allocateBlock(
      Pool& p,
      size_t size,
      StreamIndex stream,
      bool pressure,
      bool* own_cache) {
    if (p.pending_streams.load()) {
      requestCommits(p);
    }
    if (pressure) {
      garbageCollect(p);
    }
    if (Block* b = allocateFromDevice(p, size, pressure)) {
      return b;
    }
    oom_retries_.fetch_add(1);
    backend_.onAllocationFailed();
    if (Block* b = findCached(p, size, stream, /*pressure=*/false, own_cache)) {
      return b;
    }
    releaseCompleted(p, size);
    if (Block* b = allocateFromDevice(p, size, pressure)) {
      return b;
    }
    emptyCache();
    if (Block* b = allocateFromDevice(p, size, pressure)) {
      return b;
    }
    ooms_.fetch_add(1);
    const AllocatorStats s = stats();
    TORCH_CHECK(
        false,
        "MPS backend out of memory (MPS allocated: ",
        formatBytes(s.reserved_bytes),
        ", in use: ",
        formatBytes(s.allocated_bytes),
        ", waiting for other streams: ",
        formatBytes(s.pending_bytes),
        "). Tried to allocate ",
        formatBytes(static_cast<int64_t>(size)),
        " on the ",
        p.options.name,
        " pool.",
        backend_.outOfMemoryHint());
  }

  void activate(
      Block& b,
      size_t requested_size,
      StreamIndex stream,
      bool fresh) {
    b.requested_size = requested_size;
    b.stream = stream;
    b.uses = bit(stream);
    b.active.store(true, std::memory_order_relaxed);
    if (fresh) {
      Shard& shard = shardFor(backend_.key(b.buffer));
      MutexLock lock(shard.mu);
      shard.blocks.emplace(backend_.key(b.buffer), &b);
    }
  }

  // Releases cached blocks of `p` whose work is done, at least `target`
  // bytes if there are that many (SIZE_MAX: all of them), oldest first
  // when `oldest_first`.
  size_t releaseCompleted(Pool& p, size_t target, bool oldest_first = false) {
    resolvePool(p);
    std::vector<Block*> victims;
    size_t freed = 0;
    const auto take = [&](BlockSet& set, auto&& usable) {
      std::vector<Block*> candidates;
      for (Block* b : set) {
        if (usable(b) && !backend_.gpuReferenced(b->buffer)) {
          candidates.push_back(b);
        }
      }
      if (oldest_first) {
        std::sort(candidates.begin(), candidates.end(), [](auto* a, auto* b) {
          return a->cached_at < b->cached_at;
        });
      }
      for (Block* b : candidates) {
        if (freed >= target) {
          break;
        }
        set.erase(b);
        victims.push_back(b);
        freed += b->size;
      }
    };
    {
      MutexLock lock(p.mu);
      take(p.free_blocks, [](const Block*) { return true; });
    }
    for (StreamIndex s : streamsIn(p.cached_streams.load())) {
      if (freed >= target) {
        break;
      }
      const uint64_t done = refreshCompleted(s);
      StreamCache& cache = p.caches[s];
      MutexLock lock(cache.mu);
      take(cache.blocks, [&](const Block* b) { return b->fence <= done; });
    }
    releaseBlocks(p, victims);
    return victims.size();
  }

  void releaseBlocks(Pool& p, const std::vector<Block*>& victims) {
    if (victims.empty()) {
      return;
    }
    for (Block* b : victims) {
      const void* key = backend_.key(b->buffer);
      Shard& shard = shardFor(key);
      MutexLock lock(shard.mu);
      shard.blocks.erase(key);
    }
    int64_t bytes = 0;
    {
      MutexLock lock(p.mu);
      for (Block* b : victims) {
        backend_.release(p.index, b->buffer, b->data);
        bytes += static_cast<int64_t>(b->size);
      }
    }
    for (Block* b : victims) {
      delete b;
    }
    reserved_bytes_.fetch_sub(bytes);
    blocks_.fetch_sub(static_cast<int64_t>(victims.size()));
    device_releases_.fetch_add(victims.size());
  }

  // Under memory pressure: releases the oldest cached blocks of `p` until
  // the device is back under the low watermark.
  void garbageCollect(Pool& p) {
    const size_t low = low_watermark_.load();
    const size_t used = backend_.deviceAllocatedSize();
    if (low == 0 || used < low) {
      return;
    }
    gc_releases_.fetch_add(releaseCompleted(p, used - low, true));
  }

  Backend& backend_;
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
  // Events off the stream-cache fast path.
  std::atomic<int64_t> other_allocated_bytes_{0};
  std::atomic<uint64_t> other_mallocs_{0};
  std::atomic<uint64_t> other_frees_{0};
  std::atomic<uint64_t> other_hits_{0};
  std::atomic<uint64_t> stream_steals_{0};
};

} // namespace at::mps
