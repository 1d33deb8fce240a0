#pragma once

#include <ATen/mps/MPSStreamPool.h>

#include <map>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

namespace at::mps {

// Per-stream commit points (Note [MPS command buffer lifecycle]); called under
// no allocator lock, so may take stream locks and run `fn` inline.
class StreamTimelines {
 public:
  virtual ~StreamTimelines() = default;
  // The commit point that will carry all work encoded on `stream` so far.
  virtual uint64_t pendingPoint(StreamIndex stream) = 0;
  // The largest n such that commit points 1..n of `stream` have completed.
  virtual uint64_t completedPoint(StreamIndex stream) = 0;
  // A hint: must not block on the stream (others may be encoding on it).
  virtual void requestCommit(StreamIndex stream) = 0;
  // Runs `fn` once completedPoint(stream) >= value, inline if already so.
  virtual void onCompleted(
      StreamIndex stream,
      uint64_t value,
      std::function<void()> fn) = 0;
  // Commits what `value` needs and blocks until it completes: emptyCache()
  // and OOM only; the caller must not be in another stream's serial section.
  virtual void waitFor(StreamIndex stream, uint64_t value) = 0;
};

// A buffer is an opaque non-null handle; key(buffer) is the pointer users
// free. Called under allocator locks; see Note [MPS allocator locking].
class AllocatorBackend {
 public:
  virtual ~AllocatorBackend() = default;
  // nullptr when out of memory. Calls for one pool are serialised.
  virtual void* allocate(int pool, size_t size, bool memory_pressure) = 0;
  virtual void release(int pool, void* buffer) = 0;
  virtual const void* key(void* buffer) const = 0;
  virtual bool gpuReferenced(void* buffer) const = 0; // true if unsure
  virtual size_t deviceAllocatedSize() const = 0;
  virtual void onAllocationFailed() {}
  virtual std::string outOfMemoryHint() const = 0;
  virtual void onFree(void* /*buffer*/) {} // resets payload (shapes, events)
};

// Note [MPS allocator stream-cache lock]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Fast-path malloc and free lock one stream cache, mostly from its stream's
// threads, for a few set operations that never block, allocate or call out (bar
// GC's gpuReferenced). std::mutex's two atomic RMWs per section (unlock checks
// for sleepers) made single-threaded malloc/free 1.5x slower than one global
// lock on large x86 cores; CacheLock has one, an exchange. Waiters spin on a
// plain load, yield, then sleep, so a preempted holder runs at any priority.
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
  // Rule 1 of Note [MPS allocator cross-stream reuse]; false for untracked
  // memory (the scalar pool) and memory the CPU writes right after malloc.
  bool same_stream_reuse = true;
  // Above the low watermark: collect old cached blocks before device
  // allocations; reuse no block over `max_oversize` bytes larger than asked.
  bool pressure_aware = false;
  size_t max_oversize = SIZE_MAX;
};

// No update is lost; exact while no thread is in the allocator (reserved_bytes
// always). allocated_bytes sums per-stream counters (one would contend on every
// malloc) and an atomic; a free counted elsewhere skews two, never the sum.
struct AllocatorStats {
  int64_t reserved_bytes = 0; // device memory held in blocks, any state
  int64_t allocated_bytes = 0; // in blocks handed out and not yet freed
  int64_t pending_bytes = 0; // in freed blocks waiting for other streams
};

// Note [MPS allocator cross-stream reuse]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A block records its allocation stream A and its uses (A plus every
// recordStream() stream). free() takes, per used stream S, a fence
// (S, pendingPoint(S)): the commit point carrying all work encoded on S so
// far, including every use of the block (the user frees after encoding).
//  1. uses == {A} and the pool allows it: into A's stream cache, where a
//     malloc on A may take it at once. One queue runs hazard-tracked work in
//     order, so old uses finish before new ones start (one-queue rule).
//  2. Otherwise pending until every fence completes (completedPoint(S) >=
//     value), resolved by completion handlers on the fenced streams and
//     lazily by missing mallocs reading completedPoint(); then free for all.
//  3. A block in A's cache is free for every stream once its fence on A has
//     completed: a malloc missing its own cache and the free set steals it.
//  4. A malloc finding nothing usable while blocks are pending asks their
//     streams to commit (a hint, never a wait) and allocates device memory.
//     Stream caches trigger no commits: their owner needs none.
// The user contract is CUDA's:
//  - A block handed out on A is ready for work on A; another stream must
//    first wait for A (event, wait_stream()), as for any tensor made on A:
//    by rule 1 the block's previous life may still run on A.
//  - A block used on stream B must be recordStream()'d on B before free():
//    unrecorded uses are invisible, so it may be handed out on A, or
//    anywhere once A's work is done, while B still uses it.
// Only blocks with completed fences that the backend reports unreferenced by
// the GPU release device memory (GC, emptyCache, OOM), never racing GPU work.
class CachingAllocatorCore {
 public:
  using StreamMask = uint32_t;
  static_assert(kStreamsPerPool <= 32, "stream sets are 32-bit masks");

  struct Block;
  // Best fit, ties by id; Block is complete in bodies compiled with the class.
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->id < b->id;
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
    // Its set node, made with it so caching allocates nothing; empty in a set.
    BlockSet::node_type node{};
  };

  CachingAllocatorCore(
      AllocatorBackend& backend,
      StreamTimelines& timelines,
      std::vector<AllocatorPoolOptions> pools);
  // Releases every block not handed out (those leak: owners may free them at
  // process exit). No completion handler of this allocator may still run.
  ~CachingAllocatorCore();

  // `size` is pre-rounded. Raises "MPS backend out of memory" if retries fail.
  void* malloc(int pool, size_t size, StreamIndex stream);
  void free(const void* key); // Note [MPS allocator cross-stream reuse]
  // CUDA's recordStream: free() will also wait for `stream`'s work.
  void recordStream(const void* key, StreamIndex stream);

  // Waits for cached blocks' fences and releases them; later frees may stay.
  void emptyCache();
  // Moves pending blocks whose fences have completed to their pools' free sets.
  void resolvePending() {
    for (auto& p : pools_) {
      resolvePool(*p);
    }
  }
  // Pressure starts at this many device bytes (see pressure_aware); 0: never.
  void setLowWatermark(size_t bytes) {
    low_watermark_.store(bytes);
  }
  AllocatorStats stats() const;

 private:
  friend struct AllocatorCoreTestPeer;
  struct alignas(64) StreamCache {
    mutable CacheLock mu MPS_ACQUIRED_BEFORE(Shard::mu);
    BlockSet blocks MPS_GUARDED_BY(mu);
    int64_t allocated_bytes MPS_GUARDED_BY(mu) = 0; // the fast path's count
  };

  struct Pool {
    Pool(int i, AllocatorPoolOptions o) : index(i), options(std::move(o)) {}
    const int index;
    const AllocatorPoolOptions options;
    Mutex mu MPS_ACQUIRED_BEFORE(StreamCache::mu);
    BlockSet free_blocks MPS_GUARDED_BY(mu); // free for every stream
    // Pending blocks, as (pendingPoint at free -> block) per used stream.
    std::array<std::multimap<uint64_t, Block*>, kStreamsPerPool> fences
        MPS_GUARDED_BY(mu);
    // Streams with fences here / with a possibly non-empty cache. Read
    // without a lock to skip work; exact under the corresponding locks.
    std::atomic<StreamMask> pending_streams{0}, cached_streams{0};
    std::array<StreamCache, kStreamsPerPool> caches;
  };

  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    Mutex mu;
    // Every block that holds device memory, by key, handed out or not.
    std::unordered_map<const void*, Block*> blocks MPS_GUARDED_BY(mu);
  };

  using StreamPoints = std::array<uint64_t, kStreamsPerPool>;

  Shard& shardFor(const void* key) {
    auto h = reinterpret_cast<uintptr_t>(key);
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    return shards_[(h >> 32) % kShards];
  }
  // How far the device is past the low watermark; none below it or if unset.
  std::optional<size_t> overLowWatermark() const {
    const size_t low = low_watermark_.load(std::memory_order_relaxed);
    const size_t used = low ? backend_.deviceAllocatedSize() : 0;
    return low && used >= low ? std::optional(used - low) : std::nullopt;
  }
  uint64_t refreshCompleted(StreamIndex s);
  Block* findCached(Pool& p, size_t size, StreamIndex stream, bool pressure);
  void lastFences(Pool& p, StreamPoints& points);
  bool resolveLocked(Pool& p, StreamIndex s) MPS_REQUIRES(p.mu);
  bool resolvePool(Pool& p);
  Block* allocateFromDevice(Pool& p, size_t size, bool pressure);
  void releaseCompleted(Pool& p, size_t target, bool oldest_first = false);
  void releaseBlocks(Pool& p, const std::vector<Block*>& victims);

  AllocatorBackend& backend_;
  StreamTimelines& timelines_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::array<Shard, kShards> shards_;

  // Per stream, the largest point known complete / armed / asked to commit.
  std::array<std::atomic<uint64_t>, kStreamsPerPool> completed_{}, armed_{},
      commit_requested_{};

  std::atomic<size_t> low_watermark_{0};
  std::atomic<uint64_t> next_block_id_{0};

  alignas(64) std::atomic<int64_t> reserved_bytes_{0};
  std::atomic<int64_t> pending_bytes_{0}, other_allocated_bytes_{0};

 public:
  // Block `key`'s buffer as a `Buffer*`, or nullptr if `key` is no block of
  // this allocator; holds the block's shard lock while it lives.
  template <typename Buffer = void>
  class LockedBuffer {
   public:
    LockedBuffer(CachingAllocatorCore& core, const void* key)
        : shard_(core.shardFor(key)), lock_(shard_.mu) {
      const auto it = shard_.blocks.find(key);
      buffer_ = static_cast<Buffer*>(
          it == shard_.blocks.end() ? nullptr : it->second->buffer);
    }
    operator Buffer*() const {
      return buffer_;
    }
    Buffer* operator->() const {
      return buffer_;
    }

   private:
    Shard& shard_;
    MutexLock lock_;
    Buffer* buffer_;
  };
};

} // namespace at::mps
