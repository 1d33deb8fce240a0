#pragma once

#include <ATen/mps/MPSStreamPool.h>
#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/util/ArrayRef.h>

#include <unordered_map>

namespace at::mps {

// Note [MPS cross-stream dependencies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Streams (command queues) run unordered, but code handing tensors between
// threads expects single-queue results: each buffer use is ordered after
// conflicting earlier uses on other streams, with no user synchronisation.
//
// Marks. Work in a stream's open pass is "at" its open mark (1, 2, 3, ...),
// done once the stream's timeline event reaches it; a pass with work ends by
// signalling its mark (Note [MPS command buffer lifecycle]).
//
// Record. Each buffer keeps its last write (stream, mark) and each stream's
// last read since. A use by stream C waits for another stream's last write
// (RAW, WAW), a write also for other streams' reads (WAR), skipping completed
// marks. A write then becomes the only record (it follows all of it); a read
// joins the reads. A use at a mark holding C's own write is a kernel of that
// pass binding the buffer again (in-place ops: output, then input): all uses
// since depend on the pass, so it needs and changes nothing (a wait would be a
// cycle the serial order lacks). An op locks its buffers in address order (no
// deadlock) and records all its uses before any unlock, so ops sharing buffers
// get one serial order and every wait points from a later op to an earlier one.
//
// Fast path. A buffer only one stream uses holds a word (mark, wrote, stream)
// its uses update by compare-and-swap, lock-free; another stream takes it over
// by swapping in 0 under the buffer's lock. A use is recorded exactly when its
// swap succeeds, so a takeover sees it or it takes the locked path, and no
// published mark is recorded again. An op losing a buffer after publishing
// others (their takers follow it at its mark, its fallback would follow them)
// ends its pass with an empty signal and records all at the next mark; the
// abandoned mark's waiters get the work before it, as the serial order has it.
//
// Resolution, by UseSite. kBeforeEncoding (serial section, no encoder: graph
// ops at encode time, copies): the consumer's pass ends for a fresh mark, then
// a GPU wait is encoded per producer mark not completed. kInPass (encoder
// held: custom Metal kernels): no event wait fits in a pass, so the thread
// waits on the CPU for the producer's mark. Host reads (.cpu(), .item()) are
// kBeforeEncoding copies, then a wait for the reading thread's stream alone.
//
// Progress. The GPU never depends on a CPU thread:
//   1. GPU waits are only for committed marks (committedMark()); otherwise
//      the consumer commits its open work (so it holds no uncommitted mark
//      while blocked), asks the producer to commit (flushAsync(), never
//      blocking) and waits on the CPU. Waits point only to earlier ops and
//      submitted signals, so committed buffers complete unaided and a thread
//      blocked on a full queue (Metal's in-flight limit) eventually proceeds.
//   2. A recorded mark is eventually signalled, even if its op failed before
//      encoding (flushAsync()).
// Blocked threads publish their awaited (stream, mark) in waiting_on_;
// following these through uncommitted marks finds the one case with no
// valid order, a kInPass wait (unable to commit while holding its encoder)
// needing its own open pass, reported as an error naming both streams.

enum class Access : uint8_t { kRead, kWrite };
enum class UseSite : uint8_t { kBeforeEncoding, kInPass };

class TORCH_API BufferUses {
 public:
  BufferUses(uint64_t table, const void* key) : table_(table), key_(key) {}

 private:
  friend class DependencyStream;
  friend class DependencyTracker;
  // The fast path's word while every recorded use is by one stream, else 0:
  //   bit 63 ................. 9 |   8   | 7 ...... 0
  //   |   mark of the last use   | wrote | stream + 1 |
  static constexpr uint64_t kOwnerMask = 0xff;
  static constexpr uint64_t kWroteBit = 1u << 8;
  static constexpr int kMarkShift = 9;
  static_assert(kStreamsPerPool < kOwnerMask, "stream + 1 must fit");
  static constexpr uint64_t soleWord(StreamIndex s, uint64_t mark, bool wrote) {
    return (mark << kMarkShift) | (wrote ? kWroteBit : 0) |
        (static_cast<uint64_t>(s) + 1);
  }
  // What the hook's cache checks (table ids start at 1), beside sole_.
  const uint64_t table_ = 0;
  const void* const key_ = nullptr;
  std::atomic<uint64_t> sole_{0};
  Mutex mu_;
  // Packed as mark * kStreamsPerPool + stream; 0 means none.
  uint64_t last_write_ MPS_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, kStreamsPerPool> reads_ MPS_GUARDED_BY(mu_){};
  // Per stream, its last write's mark, kept once dominated; 0: none.
  std::array<uint64_t, kStreamsPerPool> wrote_at_ MPS_GUARDED_BY(mu_){};
};

namespace detail {
// Per-thread BufferUseTable lookups, tagged by table (tests make many).
struct TableCacheEntry {
  uint64_t table;
  const void* key;
  BufferUses* uses;
};
// (table, key) == (table_id, k) in one expression: with `&&`, clang keeps
// the first compare in a register (sete, then test) on the hook's fast path.
inline bool sameTableAndKey(
    uint64_t table,
    const void* key,
    uint64_t table_id,
    const void* k) {
  return ((table ^ table_id) |
          (reinterpret_cast<uintptr_t>(key) ^
           reinterpret_cast<uintptr_t>(k))) == 0;
}
constexpr size_t kTableCacheSize = 64;
inline thread_local std::array<TableCacheEntry, kTableCacheSize>
    tls_table_cache{}; // constant-initialized: a plain TLS read
inline size_t hashBufferKey(const void* key) {
  const auto k = reinterpret_cast<uintptr_t>(key);
  return static_cast<size_t>((k >> 4) ^ (k >> 12));
}
} // namespace detail

// What the tracker needs from a stream.
class DependencyStream {
 public:
  explicit DependencyStream(StreamIndex index)
      : index_(index), writer_word_(BufferUses::soleWord(index, 0, true)) {}
  StreamIndex index() const {
    return index_;
  }
  // The open pass's mark, stable in this stream's serial section. Inline, as
  // every buffer access reads it; bindOpenMark() binds it before first use.
  uint64_t openMark() const {
    return open_mark_->load(std::memory_order_acquire);
  }
  // The last mark whose signal is committed, and the last one signalled.
  virtual uint64_t committedMark() const = 0;
  virtual uint64_t completedMark() const = 0;
  // Without blocking, commits `mark` once the serial section is free: ends
  // the pass of `mark` if still open (signalled even if empty), then commits.
  virtual void flushAsync(uint64_t mark) = 0;
  // These two run in the serial section, the caller holding no encoder. End
  // the open pass, signalling its mark if it had work or `signal_if_empty`:
  virtual void closePass(bool signal_if_empty) = 0;
  virtual void commitOpen() = 0;
  // After closePass(), same serial section: later work here waits on the GPU
  // for `producer`'s committed `mark`. Joins the open pass, never ends it.
  virtual void encodeWait(DependencyStream& producer, uint64_t mark) = 0;
  virtual void waitCommitted(uint64_t mark) = 0;
  virtual void waitCompleted(uint64_t mark) = 0;

 protected:
  ~DependencyStream() = default; // never deleted through this base
  void bindOpenMark(const std::atomic<uint64_t>& open_mark) {
    open_mark_ = &open_mark;
  }

 private:
  friend class DependencyTracker;
  const StreamIndex index_;
  // BufferUses' word for a write by this stream at mark 0: the hook ORs in
  // the shifted open mark instead of building the word per access.
  const uint64_t writer_word_;
  const std::atomic<uint64_t>* open_mark_ = nullptr;
  // The hook's lookups, per stream as a thread_local is a call in a shared
  // library. Copy.mm and ConstantOps.mm bind outside the serial section, so
  // an entry is an atomic pointer to a record naming its table and key, read
  // before it can be checked: a table (PyTorch's is leaked) must outlive the
  // hooks of the streams that used it.
  std::array<std::atomic<BufferUses*>, detail::kTableCacheSize> hook_cache_{};
};

// Note [MPS buffer use table]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Maps a buffer's identity (the MTLBuffer, in PyTorch) to its BufferUses,
// made on first use and never freed: a block the allocator hands out again
// keeps its previous life's uses (a new user on another stream waits for
// them), and cached record pointers never dangle. Memory: one record per
// buffer address ever tracked. Lookups go through a small direct-mapped
// cache per thread (the hook's: per stream); a miss takes one of 64 shards.
class TORCH_API BufferUseTable {
 public:
  BufferUses& get(const void* key) {
    detail::TableCacheEntry& e = detail::tls_table_cache
        [detail::hashBufferKey(key) % detail::kTableCacheSize];
    if (C10_LIKELY(detail::sameTableAndKey(e.table, e.key, id_, key))) {
      return *e.uses;
    }
    BufferUses& uses = getSlow(key);
    e = {id_, key, &uses};
    return uses;
  }

 private:
  static constexpr size_t kShards = 64;
  struct Shard {
    Mutex mu;
    std::unordered_map<const void*, std::unique_ptr<BufferUses>> entries
        MPS_GUARDED_BY(mu);
  };
  friend class DependencyTracker;
  BufferUses& getSlow(const void* key);
  static inline std::atomic<uint64_t> next_id_{1};
  const uint64_t id_ = next_id_.fetch_add(1, std::memory_order_relaxed);
  std::array<Shard, kShards> shards_;
};

class TORCH_API DependencyTracker {
 public:
  // Registers the stream of a pool slot (once, when it is created).
  void registerStream(DependencyStream& stream) {
    streams_.at(stream.index()).store(&stream, std::memory_order_release);
  }

  struct Use {
    BufferUses* buffer;
    Access access;
  };

  // Orders one op's uses after conflicting earlier ones, then records them at
  // one mark (one pass); the caller holds `consumer`'s serial section.
  void use(DependencyStream& consumer, c10::ArrayRef<Use> uses, UseSite site);

  // The per-kernel hook: a kInPass use of `key`'s buffer in `table`. Inline
  // (a cache lookup, one load) if the pass already recorded it, as coalesced
  // kernels share a mark: `consumer` is the sole user at its open mark, and a
  // writer if this is a write. Everything else is out of line.
  void useInPass(
      DependencyStream& consumer,
      BufferUseTable& table,
      const void* key,
      Access access) {
    const BufferUses* uses =
        hookEntry(consumer, key).load(std::memory_order_acquire);
    if (C10_LIKELY(
            uses != nullptr &&
            detail::sameTableAndKey(
                uses->table_, uses->key_, table.id_, key))) {
      // A write matches a recorded write; a read, a recorded read or write.
      const uint64_t seen = uses->sole_.load(std::memory_order_acquire);
      const uint64_t wrote = (consumer.openMark() << BufferUses::kMarkShift) |
          consumer.writer_word_;
      if (C10_LIKELY(
              seen == wrote ||
              (access == Access::kRead &&
               (seen | BufferUses::kWroteBit) == wrote))) {
        return;
      }
    }
    useInPassSlow(consumer, table, key, access);
  }

 private:
  // Per producer stream, the latest mark to wait for; 0: none.
  using Needs = std::array<uint64_t, kStreamsPerPool>;
  // The slow path finds the entry again: passing it would keep it live
  // across the fast path (one more instruction per hooked access).
  static std::atomic<BufferUses*>& hookEntry(
      DependencyStream& consumer,
      const void* key) {
    return consumer
        .hook_cache_[detail::hashBufferKey(key) % detail::kTableCacheSize];
  }
  C10_NOINLINE void useInPassSlow(
      DependencyStream& consumer,
      BufferUseTable& table,
      const void* key,
      Access access) {
    const Use one{&table.get(key), access};
    hookEntry(consumer, key).store(one.buffer, std::memory_order_release);
    use(consumer, one, UseSite::kInPass);
  }
  enum class FastPath : uint8_t { kRecorded, kNotTaken, kPartlyRecorded };
  FastPath tryFastPath(StreamIndex me, uint64_t mark, c10::ArrayRef<Use> uses);
  // Records one use (buffer locked); adds what it must wait for to `needs`.
  void record(StreamIndex me, uint64_t mark, const Use& use, Needs& needs);
  bool waitsForItself(StreamIndex me, StreamIndex s, uint64_t m) const;

  std::array<std::atomic<DependencyStream*>, kStreamsPerPool> streams_{};
  // Each blocked stream's awaited (stream, mark) packed as last_write_, or 0.
  std::array<std::atomic<uint64_t>, kStreamsPerPool> waiting_on_{};
};

} // namespace at::mps
