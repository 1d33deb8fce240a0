#pragma once

// Portable cross-stream dependency tracking for MPS buffers.

#include <ATen/mps/MPSStreamPool.h>
#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/macros/Export.h>
#include <c10/macros/Macros.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace at::mps {

// Note [MPS cross-stream dependencies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With one command queue per stream, GPU work on two streams is unordered.
// PyTorch code that hands tensors between threads expects the values a
// single queue would give, so every use of a buffer is ordered after the
// conflicting uses before it on other streams (read after write, write after
// read, write after write), without the user adding synchronisation.
//
// Marks. Every pass of a stream that carried work ends with a GPU signal of
// the stream's timeline event with the pass's mark, 1, 2, 3, ... (see
// Note [MPS command buffer lifecycle]). Work encoded in the open pass is "at"
// the open mark; it has finished once the timeline event reaches that mark.
//
// Record. Each buffer remembers the last write (stream, mark) and, per
// stream, the last read since that write. A use by stream C:
//   - depends on the last write if another stream made it (RAW), and, for a
//     write, on the reads of other streams too (WAR) and on the last write
//     (WAW) -- each only while not yet completed;
//   - then replaces what it dominates: a write becomes the only record (it is
//     ordered after everything recorded before it); a read joins the reads.
// A use at a mark where the same stream's write is already recorded is
// another kernel of that pass binding the buffer again (in-place ops bind
// their output, then the same tensor as an input). Every use recorded since
// depends on the pass, so the use needs nothing and changes nothing; waiting
// for those uses would be a cycle the serial order does not have.
// An op's uses are recorded together under its buffers' locks (taken in
// address order), so ops that share buffers are recorded in one serial
// order, and every wait points from a later op to an earlier one.
//
// Fast path. A buffer used by one stream only carries a single word, (mark,
// wrote, stream); a use by that stream replaces the word with a
// compare-and-swap and takes no lock. Another stream takes the buffer over
// by exchanging the word for 0 under the buffer's lock. A use is recorded
// exactly when its swap succeeds, so a takeover sees it or it falls back to
// the locked path; a published mark never belongs to a use that is recorded
// again later. An op of several buffers can lose one after publishing
// others: whoever took a published buffer over is now ordered after this op
// at its mark, while the op's fallback records it after them. The op then
// ends its pass with an empty signal and records everything at the next
// mark; a wait for the abandoned mark is satisfied by the work before it,
// which is exactly what the serial order gives the taker.
//
// Resolution, by where the use is made (UseSite):
//   kBeforeEncoding: the consumer is in its serial section and the op holds
//     no encoder yet (graph ops at encode time, copies). The consumer's open
//     pass is ended first, so the use gets a fresh mark; then, for each
//     producer mark not completed yet, a GPU-side wait is encoded on the
//     consumer.
//   kInPass: the op already holds a compute encoder (custom Metal kernels
//     binding buffers). No event wait can be encoded inside a pass, so the
//     calling thread waits on the CPU until the producer's mark completes.
// Host reads (.cpu(), .item()) are copies on the reading thread's stream
// (kBeforeEncoding) followed by a wait for that stream alone.
//
// Progress. Two rules keep the GPU from ever depending on a CPU thread:
//   1. A GPU wait is encoded only for a mark that is already committed
//      (committedMark()). If it is not, the consumer first commits its own
//      open work (so it holds no uncommitted mark while blocked), asks the
//      producer to commit with flushAsync(), which never blocks, and waits
//      on the CPU until it has. Waits only point to earlier ops, and only to
//      submitted signals, so every committed command buffer completes
//      without help from any thread, and a thread blocked on a full queue
//      (Metal's in-flight command-buffer limit) is eventually let through.
//   2. A mark that was recorded is eventually signalled, even if the op that
//      took it failed before encoding: flushAsync(mark) ends the open pass
//      with a signal if it is still the pass of `mark`.
// A thread blocked on another stream (rules 1 and kInPass) leaves the
// (stream, mark) it waits for in waiting_on_. Following those edges while
// each awaited mark is still uncommitted finds the one case with no valid
// order: a kInPass wait, whose thread cannot commit while it holds its
// encoder, that (directly or through other waits) needs its own open pass.
// The tracker raises an error naming both streams instead of hanging.

enum class Access : uint8_t { kRead, kWrite };
enum class UseSite : uint8_t { kBeforeEncoding, kInPass };

// Per-buffer use record (in PyTorch, BufferUseTable's entry for the
// MTLBuffer); all members are private to the tracker.
class TORCH_API BufferUses {
 public:
  BufferUses() = default;
  // The record of `key` in the table `table` (BufferUseTable's id).
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
  static constexpr uint64_t soleWord(
      StreamIndex stream,
      uint64_t mark,
      bool wrote) {
    return (mark << kMarkShift) | (wrote ? kWroteBit : 0) |
        (static_cast<uint64_t>(stream) + 1);
  }
  // What the hook's cache checks (table ids start at 1), beside sole_.
  const uint64_t table_ = 0;
  const void* const key_ = nullptr;
  std::atomic<uint64_t> sole_{0};
  Mutex mu_;
  // Packed as mark * kStreamsPerPool + stream; 0 means none.
  uint64_t last_write_ MPS_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, kStreamsPerPool> reads_ MPS_GUARDED_BY(mu_){};
  // Per stream, the mark of its last recorded write, kept when later uses
  // dominate it; 0 for none (marks start at 1).
  std::array<uint64_t, kStreamsPerPool> wrote_at_ MPS_GUARDED_BY(mu_){};
};

namespace detail {
// Per-thread direct-mapped cache of BufferUseTable lookups, tagged with the
// table's id so that tables (tests make many) never see each other's
// entries. Constant-initialized, so a lookup is a plain TLS access.
struct TableCacheEntry {
  uint64_t table;
  const void* key;
  BufferUses* uses;
};
// (table, key) == (table_id, k), as one expression: written with `&&`, clang
// keeps the first compare's result in a register (sete, then test) on the
// hook's fast path.
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
    tls_table_cache{};
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
  virtual ~DependencyStream() = default;
  StreamIndex index() const {
    return index_;
  }
  // The mark of the open pass. Stable while the caller holds this stream's
  // serial section. Read inline, as every buffer access reads it; the stream
  // says where the value lives with bindOpenMark() before its first use.
  uint64_t openMark() const {
    return open_mark_->load(std::memory_order_acquire);
  }
  // The last mark whose signal is committed, and the last one signalled.
  virtual uint64_t committedMark() const = 0;
  virtual uint64_t completedMark() const = 0;
  // Makes `mark` committed as soon as the serial section is free, never
  // blocking the caller: ends the open pass if it is still the one of
  // `mark` (signalling it even if empty), then commits.
  virtual void flushAsync(uint64_t mark) = 0;
  // In this stream's serial section, with no encoder held by the caller: end
  // the open pass, signalling its mark if it carried work or if
  // `signal_if_empty`.
  virtual void closePass(bool signal_if_empty) = 0;
  // In this stream's serial section, with no encoder held by the caller:
  // commit the open work.
  virtual void commitOpen() = 0;
  // After closePass(), in the same serial section: make later work on this
  // stream wait (on the GPU) until `producer` reaches `mark`, which must be
  // committed. The wait joins the open pass; it must not end it.
  virtual void encodeWait(DependencyStream& producer, uint64_t mark) = 0;
  // Block the calling thread until this stream's `mark` is committed, or
  // completed.
  virtual void waitCommitted(uint64_t mark) = 0;
  virtual void waitCompleted(uint64_t mark) = 0;

 protected:
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
  // The hook's lookups, per stream so that it reads no thread_local (a call
  // in a shared library). Copy.mm and ConstantOps.mm bind buffers outside
  // the serial section, so an entry is one atomic pointer to a record naming
  // its table and key, read before it can be checked: a table (PyTorch's is
  // leaked) must outlive the hooks of the streams that used it.
  std::array<std::atomic<BufferUses*>, detail::kTableCacheSize> hook_cache_{};
};

// Note [MPS buffer use table]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Maps a buffer's identity (the MTLBuffer, in PyTorch) to its BufferUses.
// Entries are created on first use and never freed: a record outlives the
// tensor on purpose, so that a block the allocator hands out again still
// carries the uses of its previous life (a new user on another stream waits
// for them), and so that cached pointers to records never dangle. Memory is
// one record per distinct buffer address the process ever tracked. Lookups
// go through a small direct-mapped cache, per thread (the hook's: per
// stream); a miss takes one of 64 shard locks.
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
  size_t size() const;

 private:
  static constexpr size_t kShards = 64;
  struct Shard {
    mutable Mutex mu;
    std::unordered_map<const void*, std::unique_ptr<BufferUses>> entries
        MPS_GUARDED_BY(mu);
  };
  friend class DependencyTracker;
  BufferUses& getSlow(const void* key);
  const uint64_t id_ = nextId();
  static uint64_t nextId();
  std::array<Shard, kShards> shards_;
};

class TORCH_API DependencyTracker {
 public:
  // Registers the stream of a pool slot (once, when it is created).
  void registerStream(DependencyStream& stream);

  struct Use {
    BufferUses* buffer;
    Access access;
  };

  // Orders the uses of one op after the conflicting uses recorded before
  // them, then records them, all at one mark (the op's work is one pass).
  // `consumer` is the stream whose work uses the buffers; the caller holds
  // its serial section.
  void use(
      DependencyStream& consumer,
      const Use* uses,
      size_t count,
      UseSite site);
  void use(
      DependencyStream& consumer,
      const std::vector<Use>& uses,
      UseSite site) {
    use(consumer, uses.data(), uses.size(), site);
  }
  void use(
      DependencyStream& consumer,
      BufferUses& buffer,
      Access access,
      UseSite site) {
    const Use one{&buffer, access};
    use(consumer, &one, 1, site);
  }

  // The per-kernel hook: a kInPass use of the buffer `key` names in `table`.
  // A kernel of a pass that already recorded this use (the consumer is the
  // buffer's sole user at its open mark, a writer if this is a write) costs
  // a cache lookup and one load, inline: coalesced kernels share their
  // pass's mark. Everything else is out of line.
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

  // Waits observed so far, for tests and benchmarks.
  uint64_t gpuWaits() const {
    return gpu_waits_.load(std::memory_order_relaxed);
  }
  uint64_t cpuWaits() const {
    return cpu_waits_.load(std::memory_order_relaxed);
  }
  // Waits for another stream's commit before encoding a GPU wait.
  uint64_t commitWaits() const {
    return commit_waits_.load(std::memory_order_relaxed);
  }

 private:
  struct Need {
    StreamIndex stream;
    uint64_t point;
  };
  static std::atomic<BufferUses*>& hookEntry(
      DependencyStream& consumer,
      const void* key) {
    return consumer
        .hook_cache_[detail::hashBufferKey(key) % consumer.hook_cache_.size()];
  }
  C10_NOINLINE void useInPassSlow(
      DependencyStream& consumer,
      BufferUseTable& table,
      const void* key,
      Access access);
  enum class FastPath : uint8_t { kRecorded, kNotTaken, kPartlyRecorded };
  FastPath tryFastPath(
      StreamIndex me,
      uint64_t mark,
      const Use* uses,
      size_t count);
  static void lockAll(const std::vector<BufferUses*>& buffers);
  static void unlockAll(const std::vector<BufferUses*>& buffers);
  // Records one use, with the buffer's lock held; appends what it must wait
  // for to `needs`.
  void record(
      StreamIndex me,
      uint64_t mark,
      BufferUses& buffer,
      Access access,
      std::vector<Need>& needs);
  void resolve(
      DependencyStream& consumer,
      const std::vector<Need>& needs,
      UseSite site);
  bool waitsForItself(StreamIndex me, StreamIndex stream, uint64_t mark) const;
  enum class Until : uint8_t { kCommitted, kCompleted };
  // Blocks `consumer`'s thread until `producer` reaches `point`, publishing
  // the wait for cycle detection first.
  void waitFor(
      DependencyStream& consumer,
      DependencyStream& producer,
      uint64_t point,
      Until until);

  std::array<std::atomic<DependencyStream*>, kStreamsPerPool> streams_{};
  // The (stream, mark) each blocked stream waits for, packed as in
  // BufferUses, 0 when none; see the Progress part of the Note.
  std::array<std::atomic<uint64_t>, kStreamsPerPool> waiting_on_{};
  std::atomic<uint64_t> gpu_waits_{0};
  std::atomic<uint64_t> cpu_waits_{0};
  std::atomic<uint64_t> commit_waits_{0};
};

} // namespace at::mps
