#include <ATen/mps/MPSAllocatorCore.h>

#include <c10/core/Allocator.h>

#include <algorithm>

namespace at::mps {

// Note [MPS allocator locking]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// No global lock. Pool::mu guards a pool's free set and pending fences and
// serialises its backend allocations and releases; StreamCache::mu one stream's
// cached blocks; Shard::mu a shard of the pointer -> block table and those
// blocks' owner-visible state (uses, active flag, backend payload). Order:
// Pool::mu, StreamCache::mu, Shard::mu (MPS_ACQUIRED_BEFORE, checked by
// -Wthread-safety-beta). Today no path holds two: a block leaves one lock's
// container and enters the next's, owned by the mover in between.
// StreamTimelines is never called under an allocator lock: stream calls may
// take stream locks or wait for the GPU, and completion handlers take pool
// locks, so that could deadlock. Backend calls run under allocator locks
// (allocate/release: Pool::mu; gpuReferenced: pool or cache lock; onFree:
// Shard::mu) and must not call back into the allocator or into streams.

// Note [MPS allocator block ownership]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Exactly one party owns a block, and only it accesses the block's fields:
//  - active (handed out): the user. The handing-out malloc writes `stream`
//    and `uses` before the user sees the pointer; then `uses` and the backend
//    payload change only under the shard mutex (recordStream, LockedBuffer),
//    which free() also takes.
//  - cached (stream cache, free set or pending fences): that container's lock.
//  - in transit: the moving thread.
// `active` is a relaxed atomic so a double free is diagnosed race-free.

namespace {

using Block = CachingAllocatorCore::Block;
using StreamMask = CachingAllocatorCore::StreamMask;

StreamMask bit(StreamIndex s) {
  return StreamMask{1} << s;
}

// Visits a mask's set bits in order; the range is its own iterator.
struct StreamsIn {
  StreamMask rest;
  StreamsIn begin() const {
    return *this;
  }
  StreamsIn end() const {
    return {0};
  }
  StreamIndex operator*() const {
    return static_cast<StreamIndex>(__builtin_ctz(rest));
  }
  void operator++() {
    rest &= rest - 1;
  }
  bool operator!=(StreamsIn other) const {
    return rest != other.rest;
  }
};

// C++26's std::atomic<T>::fetch_max: raises `a` to `v`, returns the old value.
uint64_t fetchMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}

// Extracts the first `usable` fit for `size`, at most `max_oversize` larger.
template <typename Set, typename Usable>
Block* takeFit(Set& set, size_t size, size_t max_oversize, Usable&& usable) {
  Block key{nullptr, size}; // id 0: before every block of its size
  for (auto it = set.lower_bound(&key); it != set.end(); ++it) {
    Block* b = *it;
    if (b->size - size > max_oversize) {
      return nullptr; // sorted: every later block is larger still
    }
    if (usable(b)) {
      b->node = set.extract(it);
      return b;
    }
  }
  return nullptr;
}

// The active block `key` of `blocks` (a shard's table, locked by the caller).
Block* activeBlock(
    std::unordered_map<const void*, Block*>& blocks,
    const void* key,
    const char* op) {
  auto it = blocks.find(key);
  TORCH_CHECK(
      it != blocks.end() && it->second->active.load(std::memory_order_relaxed),
      "MPS allocator: ",
      op,
      " of a pointer that is not an allocated block (double free, or "
      "memory from another allocator): ptr=",
      key);
  return it->second;
}

constexpr auto any = [](const Block*) { return true; };

} // namespace

CachingAllocatorCore::CachingAllocatorCore(
    AllocatorBackend& backend,
    StreamTimelines& timelines,
    std::vector<AllocatorPoolOptions> pools)
    : backend_(backend), timelines_(timelines) {
  TORCH_CHECK(!pools.empty(), "CachingAllocatorCore: `pools` is empty");
  for (int i = 0; i < static_cast<int>(pools.size()); ++i) {
    pools_.push_back(std::make_unique<Pool>(i, std::move(pools[i])));
  }
}

CachingAllocatorCore::~CachingAllocatorCore() {
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

void* CachingAllocatorCore::malloc(int pool, size_t size, StreamIndex stream) {
  TORCH_CHECK(
      pool >= 0 && static_cast<size_t>(pool) < pools_.size(),
      "MPS allocator: pool=",
      pool,
      " is out of range, expected 0 <= pool < ",
      pools_.size());
  checkStreamIndex(stream);
  TORCH_CHECK(size > 0, "MPS allocator: malloc() of size 0");
  Pool& p = *pools_[pool];
  const bool pressure =
      p.options.pressure_aware && overLowWatermark().has_value();
  Block* b = findCached(p, size, stream, pressure);
  // A miss: commit hints, GC, device memory; then on OOM: callbacks and the
  // caches again, this pool's cached blocks, every pool's after their streams.
  if (!b) {
    if (p.pending_streams.load()) {
      StreamPoints wanted{};
      lastFences(p, wanted);
      for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
        if (wanted[s] > completed_[s].load() &&
            fetchMax(commit_requested_[s], wanted[s]) < wanted[s]) {
          timelines_.requestCommit(s);
        }
      }
    }
    if (const auto over = pressure ? overLowWatermark() : std::nullopt) {
      releaseCompleted(p, *over, /*oldest_first=*/true);
    }
    b = allocateFromDevice(p, size, pressure);
  }
  if (!b) {
    backend_.onAllocationFailed();
    b = findCached(p, size, stream, /*pressure=*/false);
  }
  if (!b) {
    releaseCompleted(p, size);
    b = allocateFromDevice(p, size, pressure);
  }
  if (!b) {
    emptyCache();
    b = allocateFromDevice(p, size, pressure);
  }
  if (!b) {
    const AllocatorStats s = stats();
    TORCH_CHECK(
        false,
        "MPS backend out of memory (MPS allocated: ",
        c10::CachingAllocator::format_size(s.reserved_bytes),
        ", in use: ",
        c10::CachingAllocator::format_size(s.allocated_bytes),
        ", waiting for other streams: ",
        c10::CachingAllocator::format_size(s.pending_bytes),
        "). Tried to allocate ",
        c10::CachingAllocator::format_size(size),
        " on the ",
        p.options.name,
        " pool.",
        backend_.outOfMemoryHint());
  }
  b->stream = stream;
  b->uses = bit(stream);
  b->active.store(true, std::memory_order_relaxed);
  return b->buffer;
}

void CachingAllocatorCore::free(const void* key) {
  Block* b = nullptr;
  {
    Shard& shard = shardFor(key);
    MutexLock lock(shard.mu);
    b = activeBlock(shard.blocks, key, "free()");
    backend_.onFree(b->buffer);
    b->active.store(false, std::memory_order_relaxed);
  }
  const StreamIndex stream = b->stream;
  const StreamMask uses = b->uses;
  Pool& p = *pools_[b->pool];
  const auto size = static_cast<int64_t>(b->size);
  const int64_t now = p.options.pressure_aware
      ? std::chrono::steady_clock::now().time_since_epoch().count()
      : 0;
  if (uses == bit(stream) && p.options.same_stream_reuse) {
    const uint64_t fence = timelines_.pendingPoint(stream);
    StreamCache& cache = p.caches[stream];
    CacheLockGuard lock(cache.mu);
    b->fence = fence;
    b->cached_at = now;
    cache.blocks.insert(std::move(b->node));
    cache.allocated_bytes -= size;
    // This stream's bit changes only under its cache lock, held here.
    if (!(p.cached_streams.load(std::memory_order_relaxed) & bit(stream))) {
      p.cached_streams.fetch_or(bit(stream));
    }
    return;
  }

  StreamPoints points{};
  for (StreamIndex s : StreamsIn{uses}) {
    points[s] = timelines_.pendingPoint(s);
  }
  other_allocated_bytes_.fetch_sub(size, std::memory_order_relaxed);
  {
    MutexLock lock(p.mu);
    b->cached_at = now;
    b->outstanding = __builtin_popcount(uses);
    for (StreamIndex s : StreamsIn{uses}) {
      p.fences[s].emplace(points[s], b);
    }
    p.pending_streams.fetch_or(uses);
    pending_bytes_.fetch_add(size);
  }
  // `b` may already be resolved and reused; use only the fences below. One
  // completion handler per stream covers all fences up to its value, so only
  // a larger value registers one. A handler publishes its value before
  // sweeping, so a fence added after its sweep of `p` sees the value here.
  for (StreamIndex s : StreamsIn{uses}) {
    const uint64_t value = points[s];
    if (fetchMax(armed_[s], value) < value) {
      timelines_.onCompleted(s, value, [this, s, value] {
        fetchMax(completed_[s], value);
        for (auto& pool : pools_) {
          if (pool->pending_streams.load() & bit(s)) {
            MutexLock lock(pool->mu);
            resolveLocked(*pool, s);
          }
        }
      });
    } else if (value <= completed_[s].load()) {
      MutexLock lock(p.mu);
      resolveLocked(p, s);
    }
  }
}

void CachingAllocatorCore::recordStream(const void* key, StreamIndex stream) {
  checkStreamIndex(stream);
  Shard& shard = shardFor(key);
  MutexLock lock(shard.mu);
  activeBlock(shard.blocks, key, "recordStream()")->uses |= bit(stream);
}

void CachingAllocatorCore::emptyCache() {
  StreamPoints need{};
  for (auto& p : pools_) {
    lastFences(*p, need);
    for (StreamIndex s : StreamsIn{p->cached_streams.load()}) {
      StreamCache& cache = p->caches[s];
      CacheLockGuard lock(cache.mu);
      for (Block* b : cache.blocks) {
        need[s] = std::max(need[s], b->fence);
      }
    }
  }
  for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
    if (need[s] > completed_[s].load() && refreshCompleted(s) < need[s]) {
      timelines_.waitFor(s, need[s]);
      fetchMax(completed_[s], need[s]);
    }
  }
  for (auto& p : pools_) {
    releaseCompleted(*p, SIZE_MAX);
  }
}

AllocatorStats CachingAllocatorCore::stats() const {
  AllocatorStats s{reserved_bytes_, other_allocated_bytes_, pending_bytes_};
  for (const auto& p : pools_) {
    for (auto& cache : p->caches) {
      CacheLockGuard lock(cache.mu);
      s.allocated_bytes += cache.allocated_bytes;
    }
  }
  return s;
}

// The stream's completed point, read now; also raises the cached value.
uint64_t CachingAllocatorCore::refreshCompleted(StreamIndex s) {
  const uint64_t done = timelines_.completedPoint(s);
  return std::max(done, fetchMax(completed_[s], done));
}

// Tries `stream`'s cache (counted there), the pool's free set (again after
// resolving pending blocks), then other streams' caches.
CachingAllocatorCore::Block* CachingAllocatorCore::findCached(
    Pool& p,
    size_t size,
    StreamIndex stream,
    bool pressure) {
  const size_t max_oversize = pressure ? p.options.max_oversize : SIZE_MAX;
  if (p.options.same_stream_reuse) {
    StreamCache& cache = p.caches[stream];
    CacheLockGuard lock(cache.mu);
    if (Block* b = takeFit(cache.blocks, size, max_oversize, any)) {
      cache.allocated_bytes += static_cast<int64_t>(b->size);
      return b;
    }
  }
  const auto takeFree = [&] {
    MutexLock lock(p.mu);
    return takeFit(p.free_blocks, size, max_oversize, any);
  };
  Block* b = takeFree();
  if (!b && resolvePool(p)) {
    b = takeFree();
  }
  const StreamMask others = b ? 0 : p.cached_streams.load() & ~bit(stream);
  for (StreamIndex s : StreamsIn{others}) {
    const uint64_t done = refreshCompleted(s);
    StreamCache& cache = p.caches[s];
    CacheLockGuard lock(cache.mu);
    const auto ready = [done](const Block* c) { return c->fence <= done; };
    if (cache.blocks.empty()) {
      p.cached_streams.fetch_and(~bit(s));
    } else if ((b = takeFit(cache.blocks, size, max_oversize, ready))) {
      break;
    }
  }
  if (b) {
    other_allocated_bytes_.fetch_add(
        static_cast<int64_t>(b->size), std::memory_order_relaxed);
  }
  return b;
}

// Raises points[s] to `p`'s last fence on s, for each stream s with fences.
void CachingAllocatorCore::lastFences(Pool& p, StreamPoints& points) {
  MutexLock lock(p.mu);
  for (StreamIndex s : StreamsIn{p.pending_streams.load()}) {
    points[s] = std::max(points[s], p.fences[s].rbegin()->first);
  }
}

// Pops `s`'s fences that completed_[s] covers; true if that freed a block.
bool CachingAllocatorCore::resolveLocked(Pool& p, StreamIndex s) {
  auto& fences = p.fences[s];
  bool freed = false;
  const auto end = fences.upper_bound(completed_[s].load());
  for (auto it = fences.begin(); it != end; ++it) {
    if (Block* b = it->second; --b->outstanding == 0) {
      p.free_blocks.insert(std::move(b->node));
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

// Lazy resolution: reads completed points outside the lock, then resolves.
bool CachingAllocatorCore::resolvePool(Pool& p) {
  const StreamMask mask = p.pending_streams.load();
  if (!mask) {
    return false;
  }
  for (StreamIndex s : StreamsIn{mask}) {
    refreshCompleted(s);
  }
  MutexLock lock(p.mu);
  bool freed = false;
  for (StreamIndex s : StreamsIn{mask}) {
    freed |= resolveLocked(p, s);
  }
  return freed;
}

// A new block, in the block table and counted as in use (for the caller).
CachingAllocatorCore::Block* CachingAllocatorCore::allocateFromDevice(
    Pool& p,
    size_t size,
    bool pressure) {
  void* const buffer = [&] {
    MutexLock lock(p.mu);
    return backend_.allocate(p.index, size, pressure);
  }();
  if (!buffer) {
    return nullptr;
  }
  auto* b = new Block{buffer, size, p.index, next_block_id_.fetch_add(1) + 1};
  b->node = BlockSet{b}.extract(b);
  const auto bytes = static_cast<int64_t>(size);
  reserved_bytes_.fetch_add(bytes);
  other_allocated_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  const void* key = backend_.key(b->buffer);
  Shard& shard = shardFor(key);
  MutexLock lock(shard.mu);
  shard.blocks.emplace(key, b);
  return b;
}

// Releases done cached blocks of `p`, at least `target` bytes if there are
// that many (SIZE_MAX: all), oldest first if `oldest_first`.
void CachingAllocatorCore::releaseCompleted(
    Pool& p,
    size_t target,
    bool oldest_first) {
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
    for (size_t i = 0; i < candidates.size() && freed < target; ++i) {
      set.erase(candidates[i]);
      victims.push_back(candidates[i]);
      freed += candidates[i]->size;
    }
  };
  {
    MutexLock lock(p.mu);
    take(p.free_blocks, any);
  }
  for (StreamIndex s : StreamsIn{p.cached_streams.load()}) {
    if (freed >= target) {
      break;
    }
    const uint64_t done = refreshCompleted(s);
    StreamCache& cache = p.caches[s];
    CacheLockGuard lock(cache.mu);
    take(cache.blocks, [&](const Block* b) { return b->fence <= done; });
  }
  releaseBlocks(p, victims);
}

void CachingAllocatorCore::releaseBlocks(
    Pool& p,
    const std::vector<Block*>& victims) {
  for (Block* b : victims) {
    const void* key = backend_.key(b->buffer);
    Shard& shard = shardFor(key);
    MutexLock lock(shard.mu);
    shard.blocks.erase(key);
  }
  MutexLock lock(p.mu);
  for (Block* b : victims) {
    backend_.release(p.index, b->buffer);
    reserved_bytes_.fetch_sub(static_cast<int64_t>(b->size));
    delete b;
  }
}

} // namespace at::mps
