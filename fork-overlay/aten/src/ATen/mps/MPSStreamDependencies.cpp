//  Copyright © 2026 Apple Inc.

#include <ATen/mps/MPSStreamDependencies.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace at::mps {

namespace {

constexpr uint64_t pack(StreamIndex stream, uint64_t point) {
  return point * kStreamsPerPool + static_cast<uint64_t>(stream);
}
constexpr StreamIndex streamOf(uint64_t packed) {
  return static_cast<StreamIndex>(packed % kStreamsPerPool);
}
constexpr uint64_t pointOf(uint64_t packed) {
  return packed / kStreamsPerPool;
}

// BufferUses::sole_user_ holds (stream + 1), plus this bit once that stream
// has written the buffer during its sole-use period.
constexpr uint32_t kWroteBit = 1u << 8;
constexpr uint32_t kOwnerMask = kWroteBit - 1;
static_assert(kStreamsPerPool < kWroteBit, "owner must fit below kWroteBit");

} // namespace

namespace {
// Per-thread cache of BufferUseTable lookups, tagged with the table's id so
// that tables (the harness makes many) never see each other's entries.
struct TableCacheEntry {
  uint64_t table;
  const void* key;
  BufferUses* uses;
};
constexpr size_t kTableCacheSize = 64;
thread_local std::array<TableCacheEntry, kTableCacheSize> tls_table_cache{};

size_t hashKey(const void* key) {
  const auto k = reinterpret_cast<uintptr_t>(key);
  return static_cast<size_t>((k >> 4) ^ (k >> 12));
}
} // namespace

uint64_t BufferUseTable::nextId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

BufferUses& BufferUseTable::get(const void* key) {
  TableCacheEntry& e = tls_table_cache[hashKey(key) % kTableCacheSize];
  if (C10_LIKELY(e.table == id_ && e.key == key)) {
    return *e.uses;
  }
  BufferUses& uses = getSlow(key);
  e = {id_, key, &uses};
  return uses;
}

BufferUses& BufferUseTable::getSlow(const void* key) {
  Shard& shard = shards_[hashKey(key) % kShards];
  MutexLock lock(shard.mu);
  auto& slot = shard.entries[key];
  if (!slot) {
    slot = std::make_unique<BufferUses>();
  }
  return *slot;
}

size_t BufferUseTable::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    MutexLock lock(s.mu);
    n += s.entries.size();
  }
  return n;
}

DependencyTracker::DependencyTracker() {
  for (auto& w : waiting_on_) {
    w.store(-1, std::memory_order_relaxed);
  }
}

void DependencyTracker::registerStream(DependencyStream& stream) {
  streams_.at(stream.index()).store(&stream, std::memory_order_release);
}

void DependencyTracker::use(
    DependencyStream& consumer,
    const Use* uses,
    size_t count,
    UseSite site) {
  const StreamIndex me = consumer.index();
  if (site == UseSite::kBeforeEncoding) {
    consumer.closePass(); // the op's work gets a mark of its own
  }
  const uint64_t mark = consumer.openMark();
  if (site != UseSite::kHost && tryFastPath(me, mark, uses, count)) {
    return;
  }

  // Strict two-phase locking: an op's buffers are locked together (in address
  // order, so two ops cannot deadlock) and all its uses recorded before any
  // is released. Ops touching common buffers are thereby recorded in one
  // serial order, which keeps the waits between them acyclic even when two
  // threads race on each other's buffers.
  std::vector<BufferUses*> locked;
  for (size_t i = 0; i < count; ++i) {
    locked.push_back(uses[i].buffer);
  }
  std::sort(locked.begin(), locked.end());
  locked.erase(std::unique(locked.begin(), locked.end()), locked.end());
  std::vector<Need> needs;
  lockAll(locked);
  for (size_t i = 0; i < count; ++i) {
    record(me, mark, *uses[i].buffer, uses[i].access, site, needs);
  }
  unlockAll(locked);

  // Resolve outside the buffers' locks: waiting here must never block another
  // stream that only wants to record a use. One wait per producer suffices.
  std::sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) {
    return a.stream != b.stream ? a.stream < b.stream : a.point > b.point;
  });
  for (size_t i = 0; i < needs.size(); ++i) {
    if (i == 0 || needs[i].stream != needs[i - 1].stream) {
      resolve(consumer, needs[i], site);
    }
  }
}

// The fast path (see the Note) applies when every buffer of the op is used
// by this stream alone. Each mark is published before the owner word is
// checked again, so a slow path on another stream that takes a buffer over
// either sees the mark or makes this op fall back to the slow path (which
// records the same uses again, harmlessly).
bool DependencyTracker::tryFastPath(
    StreamIndex me,
    uint64_t mark,
    const Use* uses,
    size_t count) {
  const uint32_t owner = static_cast<uint32_t>(me) + 1;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t seen =
        uses[i].buffer->sole_user_.load(std::memory_order_seq_cst);
    if ((seen & kOwnerMask) != owner ||
        (uses[i].access == Access::kWrite && !(seen & kWroteBit))) {
      return false;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    BufferUses& b = *uses[i].buffer;
    const uint32_t seen = b.sole_user_.load(std::memory_order_seq_cst);
    b.sole_point_.store(mark, std::memory_order_seq_cst);
    if (b.sole_user_.load(std::memory_order_seq_cst) != seen ||
        (seen & kOwnerMask) != owner) {
      return false;
    }
  }
  return true;
}

// Escape hatch: the number of locks depends on the op, which the analysis
// cannot express; use() pairs these calls.
void DependencyTracker::lockAll(const std::vector<BufferUses*>& buffers)
    MPS_NO_THREAD_SAFETY_ANALYSIS {
  for (BufferUses* b : buffers) {
    b->mu_.lock();
  }
}

void DependencyTracker::unlockAll(const std::vector<BufferUses*>& buffers)
    MPS_NO_THREAD_SAFETY_ANALYSIS {
  for (BufferUses* b : buffers) {
    b->mu_.unlock();
  }
}

// Called by use() with `buffer`'s lock held (see lockAll).
void DependencyTracker::record(
    StreamIndex me,
    uint64_t point,
    BufferUses& buffer,
    Access access,
    UseSite site,
    std::vector<Need>& needs) MPS_NO_THREAD_SAFETY_ANALYSIS {
  const uint32_t owner = static_cast<uint32_t>(me) + 1;
  // Fold the sole-use period into the records.
  const uint32_t sole =
      buffer.sole_user_.exchange(0, std::memory_order_seq_cst);
  if (sole != 0) {
    const StreamIndex s = static_cast<StreamIndex>((sole & kOwnerMask) - 1);
    const uint64_t p = buffer.sole_point_.load(std::memory_order_seq_cst);
    if (sole & kWroteBit) {
      buffer.last_write_ = pack(s, p);
      buffer.reads_.fill(0);
    } else {
      buffer.reads_[s] = std::max(buffer.reads_[s], p);
    }
  }

  auto need = [&](StreamIndex s, uint64_t p) {
    DependencyStream* producer = streams_[s].load(std::memory_order_acquire);
    TORCH_INTERNAL_ASSERT(producer != nullptr, "unregistered MPS stream ", s);
    if (producer->completedMark() < p) {
      needs.push_back({s, p});
    }
  };
  // The CPU is no stream: a host use waits for the consumer's own work too.
  const StreamIndex self = site == UseSite::kHost ? -1 : me;
  if (buffer.last_write_ != 0 && streamOf(buffer.last_write_) != self) {
    need(streamOf(buffer.last_write_), pointOf(buffer.last_write_));
  }
  if (access == Access::kWrite) {
    for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
      if (s != self && buffer.reads_[s] != 0) {
        need(s, buffer.reads_[s]);
      }
    }
  }

  // Record this use. Host uses are not stream work: they only wait.
  if (site != UseSite::kHost) {
    if (access == Access::kWrite) {
      buffer.last_write_ = pack(me, point);
      buffer.reads_.fill(0);
    } else {
      buffer.reads_[me] = std::max(buffer.reads_[me], point);
    }
    const bool writer_is_me =
        buffer.last_write_ == 0 || streamOf(buffer.last_write_) == me;
    bool others_read = false;
    for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
      others_read |= s != me && buffer.reads_[s] != 0;
    }
    if (writer_is_me && !others_read) {
      // Hand the buffer to the fast path, records folded into the word.
      const bool wrote = buffer.last_write_ != 0;
      buffer.sole_point_.store(
          std::max(buffer.reads_[me], pointOf(buffer.last_write_)),
          std::memory_order_seq_cst);
      buffer.last_write_ = 0;
      buffer.reads_[me] = 0;
      buffer.sole_user_.store(
          owner | (wrote ? kWroteBit : 0), std::memory_order_seq_cst);
    }
  }
}

void DependencyTracker::resolve(
    DependencyStream& consumer,
    const Need& need,
    UseSite site) {
  DependencyStream& producer =
      *streams_[need.stream].load(std::memory_order_acquire);
  if (producer.completedMark() >= need.point) {
    return;
  }
  if (producer.committedMark() < need.point) {
    producer.flushAsync();
  }
  switch (site) {
    case UseSite::kBeforeEncoding:
      consumer.encodeWait(producer, need.point);
      gpu_waits_.fetch_add(1, std::memory_order_relaxed);
      return;
    case UseSite::kInPass:
      waitInPass(consumer, producer, need.point);
      return;
    case UseSite::kHost:
      producer.waitCompleted(need.point);
      cpu_waits_.fetch_add(1, std::memory_order_relaxed);
      return;
  }
}

void DependencyTracker::waitInPass(
    DependencyStream& consumer,
    DependencyStream& producer,
    uint64_t point) {
  const StreamIndex me = consumer.index();
  waiting_on_[me].store(producer.index(), std::memory_order_seq_cst);
  // Follow the waits-for chain: if it leads back here, both passes need each
  // other's open work and no order exists without splitting a pass.
  StreamIndex s = producer.index();
  for (int hops = 0; hops < kStreamsPerPool && s >= 0; ++hops) {
    if (s == me) {
      waiting_on_[me].store(-1, std::memory_order_seq_cst);
      TORCH_CHECK(
          false,
          "MPS stream ",
          me,
          " and stream ",
          producer.index(),
          " are each encoding a kernel that reads a buffer the other one is "
          "still writing in its open pass, so neither can go first. Order "
          "the two threads (torch.mps.synchronize(), an Event, or "
          "Stream.wait_stream) or let one finish before the other uses its "
          "outputs. See reports/cross-stream-contract.md.");
    }
    s = waiting_on_[s].load(std::memory_order_seq_cst);
  }
  try {
    producer.waitCompleted(point);
  } catch (...) {
    waiting_on_[me].store(-1, std::memory_order_seq_cst);
    throw;
  }
  waiting_on_[me].store(-1, std::memory_order_seq_cst);
  cpu_waits_.fetch_add(1, std::memory_order_relaxed);
}

} // namespace at::mps
