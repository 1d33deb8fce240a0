#include <ATen/mps/MPSStreamDependencies.h>

#include <c10/util/ScopeExit.h>

#include <algorithm>

// A test build's hook, run just after the fast path published an op's buffer
// `i`: a takeover then must not make two streams wait for each other.
#ifndef MPS_DEPENDENCY_FAST_PATH_HOOK
#define MPS_DEPENDENCY_FAST_PATH_HOOK(i)
#endif

namespace at::mps {

static constexpr uint64_t pack(StreamIndex stream, uint64_t point) {
  return point * kStreamsPerPool + static_cast<uint64_t>(stream);
}
static constexpr StreamIndex streamOf(uint64_t packed) {
  return static_cast<StreamIndex>(packed % kStreamsPerPool);
}
static constexpr uint64_t pointOf(uint64_t packed) {
  return packed / kStreamsPerPool;
}

BufferUses& BufferUseTable::getSlow(const void* key) {
  Shard& shard = shards_[detail::hashBufferKey(key) % kShards];
  MutexLock lock(shard.mu);
  auto& slot = shard.entries[key];
  if (!slot) {
    slot = std::make_unique<BufferUses>(id_, key);
  }
  return *slot;
}

// Escape hatch: the analysis cannot express a per-op number of locks.
void DependencyTracker::use(
    DependencyStream& consumer,
    c10::ArrayRef<Use> uses,
    UseSite site) MPS_NO_THREAD_SAFETY_ANALYSIS {
  const StreamIndex me = consumer.index();
  if (site == UseSite::kBeforeEncoding) {
    consumer.closePass(/*signal_if_empty=*/false); // the op gets its own mark
  }
  uint64_t mark = consumer.openMark();
  const FastPath fast = tryFastPath(me, mark, uses);
  if (fast == FastPath::kRecorded) {
    return;
  }
  if (fast == FastPath::kPartlyRecorded) {
    // "Fast path" in the Note: abandon this mark, record at the next.
    consumer.closePass(/*signal_if_empty=*/true);
    mark = consumer.openMark();
  }

  // Two-phase locking in address order; see "Record" in the Note.
  std::vector<BufferUses*> locked;
  for (const Use& u : uses) {
    locked.push_back(u.buffer);
  }
  std::sort(locked.begin(), locked.end());
  locked.erase(std::unique(locked.begin(), locked.end()), locked.end());
  Needs needs{};
  for (BufferUses* b : locked) {
    b->mu_.lock();
  }
  for (const Use& u : uses) {
    record(me, mark, u, needs);
  }
  for (BufferUses* b : locked) {
    b->mu_.unlock();
  }

  // Resolve outside the buffers' locks: waiting here must never block another
  // stream that only wants to record a use.
  bool committed_own = false;
  for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
    DependencyStream* producer = streams_[s].load(std::memory_order_acquire);
    if (needs[s] == 0 || producer->completedMark() >= needs[s]) {
      continue;
    }
    const bool committed = producer->committedMark() >= needs[s];
    if (!committed) {
      if (site == UseSite::kBeforeEncoding && !committed_own) {
        consumer.commitOpen();
        committed_own = true;
      }
      producer->flushAsync(needs[s]);
    }
    // Progress rule 1: only committed marks are waited for on the GPU.
    if (site == UseSite::kBeforeEncoding && committed) {
      continue;
    }
    // Published while blocked, for waitsForItself().
    waiting_on_[me].store(pack(s, needs[s]), std::memory_order_seq_cst);
    const auto unpublish = c10::make_scope_exit(
        [&] { waiting_on_[me].store(0, std::memory_order_seq_cst); });
    TORCH_CHECK(
        !waitsForItself(me, s, needs[s]),
        "MPS stream ",
        me,
        " and stream ",
        s,
        " each need work the other has not submitted, and one of them is "
        "encoding a Metal kernel that reads a buffer the other one is "
        "still writing, so neither can go first. Order the two threads "
        "(torch.mps.synchronize(), an Event, or Stream.wait_stream) or let "
        "one finish before the other uses its outputs.");
    if (site == UseSite::kInPass) {
      producer->waitCompleted(needs[s]);
    } else {
      producer->waitCommitted(needs[s]);
    }
  }
  if (site == UseSite::kInPass) {
    return;
  }
  // Every mark is committed now; the waits join the op's (still empty) pass.
  for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
    DependencyStream* producer = streams_[s].load(std::memory_order_acquire);
    if (needs[s] != 0 && producer->completedMark() < needs[s]) {
      consumer.encodeWait(*producer, needs[s]);
    }
  }
}

// kInPass ops of several buffers never take it: their pass is open, so a
// partly published op could not move to a fresh mark.
DependencyTracker::FastPath DependencyTracker::tryFastPath(
    StreamIndex me,
    uint64_t mark,
    c10::ArrayRef<Use> uses) {
  const uint64_t owner = static_cast<uint64_t>(me) + 1;
  for (const Use& u : uses) {
    const uint64_t seen = u.buffer->sole_.load(std::memory_order_acquire);
    if ((seen & BufferUses::kOwnerMask) != owner ||
        (u.access == Access::kWrite && !(seen & BufferUses::kWroteBit))) {
      return FastPath::kNotTaken;
    }
  }
  bool published = false;
  for (size_t i = 0; i < uses.size(); ++i) {
    std::atomic<uint64_t>& word = uses[i].buffer->sole_;
    uint64_t seen = word.load(std::memory_order_acquire);
    const uint64_t want = (mark << BufferUses::kMarkShift) |
        (seen & ~(~0ull << BufferUses::kMarkShift));
    // The same mark again (coalesced kernels) is recorded: no write.
    if (seen != want) {
      if ((seen & BufferUses::kOwnerMask) != owner ||
          !word.compare_exchange_strong(
              seen, want, std::memory_order_acq_rel)) {
        return published ? FastPath::kPartlyRecorded : FastPath::kNotTaken;
      }
      published = true;
      MPS_DEPENDENCY_FAST_PATH_HOOK(i);
    }
  }
  return FastPath::kRecorded;
}

void DependencyTracker::record(
    StreamIndex me,
    uint64_t point,
    const Use& use,
    Needs& needs) MPS_NO_THREAD_SAFETY_ANALYSIS {
  BufferUses& buffer = *use.buffer;
  // The same pass wrote it already (Note [MPS cross-stream dependencies]).
  if (buffer.wrote_at_[me] == point) {
    return;
  }
  // Fold the fast path's word into the records.
  const uint64_t sole = buffer.sole_.exchange(0, std::memory_order_acq_rel);
  if (sole != 0) {
    const StreamIndex s =
        static_cast<StreamIndex>((sole & BufferUses::kOwnerMask) - 1);
    const uint64_t p = sole >> BufferUses::kMarkShift;
    if (sole & BufferUses::kWroteBit) {
      buffer.last_write_ = pack(s, p);
      buffer.wrote_at_[s] = p;
      buffer.reads_.fill(0);
    } else {
      buffer.reads_[s] = std::max(buffer.reads_[s], p);
    }
  }

  auto need = [&](StreamIndex s, uint64_t p) {
    DependencyStream* producer = streams_[s].load(std::memory_order_acquire);
    TORCH_INTERNAL_ASSERT(producer != nullptr, "unregistered MPS stream ", s);
    if (producer->completedMark() < p) {
      needs[s] = std::max(needs[s], p);
    }
  };
  if (buffer.last_write_ != 0 && streamOf(buffer.last_write_) != me) {
    need(streamOf(buffer.last_write_), pointOf(buffer.last_write_));
  }
  if (use.access == Access::kWrite) {
    for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
      if (s != me && buffer.reads_[s] != 0) {
        need(s, buffer.reads_[s]);
      }
    }
    buffer.last_write_ = pack(me, point);
    buffer.wrote_at_[me] = point;
    buffer.reads_.fill(0);
  } else {
    buffer.reads_[me] = std::max(buffer.reads_[me], point);
  }
  bool only_me = buffer.last_write_ == 0 || streamOf(buffer.last_write_) == me;
  for (StreamIndex s = 0; s < kStreamsPerPool; ++s) {
    only_me &= s == me || buffer.reads_[s] == 0;
  }
  if (only_me) {
    // Hand the buffer to the fast path, records folded into the word.
    const uint64_t word = BufferUses::soleWord(
        me,
        std::max(buffer.reads_[me], pointOf(buffer.last_write_)),
        buffer.last_write_ != 0);
    buffer.last_write_ = 0;
    buffer.reads_[me] = 0;
    buffer.sole_.store(word, std::memory_order_release);
  }
}

// "Progress" in the Note. The walk reads a stream's committed mark before its
// wait, so one that committed and then waited can look stuck: a cycle back
// to `me` counts only if, rechecked, every mark on it is uncommitted and
// every wait still published. Marks only grow, so a real cycle passes, and
// the last of its waits to be published always sees the others.
bool DependencyTracker::waitsForItself(
    StreamIndex me,
    StreamIndex s,
    uint64_t m) const {
  std::array<uint64_t, kStreamsPerPool + 1> chain{};
  size_t n = 0;
  while (true) {
    if (n == chain.size() ||
        streams_[s].load(std::memory_order_acquire)->committedMark() >= m) {
      return false;
    }
    chain[n++] = pack(s, m);
    if (s == me) {
      break;
    }
    const uint64_t next = waiting_on_[s].load(std::memory_order_seq_cst);
    if (next == 0) {
      return false;
    }
    s = streamOf(next);
    m = pointOf(next);
  }
  for (size_t i = 0; i < n; ++i) {
    const StreamIndex t = streamOf(chain[i]);
    if (streams_[t].load(std::memory_order_acquire)->committedMark() >=
            pointOf(chain[i]) ||
        (i + 1 < n &&
         waiting_on_[t].load(std::memory_order_seq_cst) != chain[i + 1])) {
      return false;
    }
  }
  return true;
}

} // namespace at::mps
