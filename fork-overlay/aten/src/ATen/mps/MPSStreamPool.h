#pragma once

// Portable stream pool for the MPS backend: slot leasing, the per-thread
// current stream and lazy stream creation. No Objective-C and no Metal here:
// PyTorch instantiates StreamPool<MPSStream> and the standalone harness
// instantiates it with a simulated stream, from this same file.

#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/macros/Export.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace at::mps {

// Note [MPS stream pool]
// ~~~~~~~~~~~~~~~~~~~~~~
// A process has kStreamsPerPool MPS streams, each with its own command queue.
// Slot 0 is the default stream; slots 1..kStreamsPerPool-1 are worker
// streams. Streams are created lazily, exactly once, on first use of their
// slot; a failed creation leaves the slot empty so a later call can retry.
//
// Every thread has a current stream (thread-local, see Note [MPS current
// stream]). The process's main thread starts on the default stream. Any other
// thread, on first use, leases a free worker slot *exclusively*: no other
// thread gets that slot from the lease path until the lease comes back, when
// the thread exits or calls releaseCurrentThreadSlot(). When all worker slots
// are leased, the policy read from MPS_STREAM_POOL_WAIT_TIMEOUT_MS decides
// (see ExhaustionPolicy).
//
// Exclusivity is a scheduling property, not a safety one: a stream can still
// be reached by several threads at once (share mode, getStreamFromPool(),
// guards, tensors used from other threads), so everything a stream does must
// be safe under concurrent callers.
//
// The pool is shared by the whole process. The production pool is leaked on
// purpose, as CUDA leaks its streams: static destructors may run after the
// Metal runtime is gone, and threads may still hold leases at exit.

constexpr int kStreamsPerPool = 32;
constexpr int kDefaultStreamIndex = 0;
constexpr int kWorkerStreams = kStreamsPerPool - 1;

// Index of a slot in the pool, in [0, kStreamsPerPool).
using StreamIndex = int;

// Note [MPS stream ids]
// ~~~~~~~~~~~~~~~~~~~~~
// A c10::Stream for MPS carries the pool slot index as its StreamId:
//
//   bit 63 .............................. 5 4 ........ 0
//   |              always zero             | slot index |
//
// so id 0 is the default stream (the id v2.9.1 used for its single stream)
// and the sign bit stays clear. Any other id is rejected with an error that
// names it.
constexpr int kStreamIdIndexBits = 5;
static_assert(
    kStreamsPerPool <= (1 << kStreamIdIndexBits),
    "slot index must fit the StreamId index bits");
static_assert(kDefaultStreamIndex == 0, "id 0 must stay the default stream");

TORCH_API int64_t streamIdFromIndex(StreamIndex index);
TORCH_API StreamIndex streamIndexFromId(int64_t stream_id);

constexpr const char* kWaitTimeoutEnvVar = "MPS_STREAM_POOL_WAIT_TIMEOUT_MS";

// What a thread's first use does when every worker slot is leased.
enum class ExhaustionPolicy {
  // Unset variable: hand out a worker stream round-robin, shared with other
  // threads (CUDA-style oversubscription). Never fails.
  kShare,
  // "0": throw at once.
  kThrow,
  // "-1": block until a slot is released.
  kWait,
  // "N" (N > 0): block up to N ms, then throw.
  kWaitTimeout,
};

struct ExhaustionConfig {
  ExhaustionPolicy policy = ExhaustionPolicy::kShare;
  std::chrono::milliseconds timeout{0}; // used by kWaitTimeout only
};

// Parses the value of MPS_STREAM_POOL_WAIT_TIMEOUT_MS. nullptr or "" means
// unset. Accepts a decimal integer >= -1 that fits in 32 bits; anything else
// throws an error naming the variable and the accepted forms.
TORCH_API ExhaustionConfig parseExhaustionConfig(const char* value);

struct StreamPoolOptions {
  ExhaustionConfig exhaustion;
  // Decides which thread starts on the default stream. Defaults to the
  // process's main thread; tests substitute their own.
  std::function<bool()> is_main_thread;

  // Reads MPS_STREAM_POOL_WAIT_TIMEOUT_MS once.
  static StreamPoolOptions fromEnvironment();
};

TORCH_API bool isProcessMainThread();

namespace detail {
// The binding of the pool the calling thread used last; see
// Note [MPS current stream]. Constant-initialized and trivially
// destructible, so reading it is a plain TLS load. MPSStreamPool.cpp writes
// pool_id and current, always with stream = nullptr; StreamPool fills in
// the stream of that slot, and only while pool_id and current still match.
// If a shared library that merely inlines the readers ever held a separate
// copy, that copy would stay empty and always take the checked slow path,
// which is correct.
struct SlotCache {
  uint64_t pool_id;
  int current; // StreamIndex; -1: no binding
  void* stream; // the stream of `current`, once StreamPool looked it up
};
inline thread_local SlotCache tls_slot_cache = {0, -1, nullptr};
} // namespace detail

// Note [MPS current stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Per thread and per pool, the thread's binding holds its current slot and
// the slot it leases (if any). A trivially destructible thread_local caches
// the binding of the pool the thread used last, so the fast path is: load the
// cached pool id, compare, load the cached index. The full binding list lives
// in a second thread_local whose destructor returns leases when the thread
// exits. Bindings name pools by a process-unique id, never by address, so a
// pool destroyed in a test and another built at the same address cannot be
// confused; pools register in a process-wide table, and a thread that exits
// after its pool is gone has nothing to return.
class TORCH_API StreamSlotPool {
 public:
  explicit StreamSlotPool(StreamPoolOptions options);
  ~StreamSlotPool();
  StreamSlotPool(const StreamSlotPool&) = delete;
  StreamSlotPool& operator=(const StreamSlotPool&) = delete;

  // The calling thread's current slot; the first call on a non-main thread
  // leases a worker slot (or applies the exhaustion policy).
  StreamIndex currentIndex() {
    const detail::SlotCache cached = detail::tls_slot_cache;
    if (C10_LIKELY(cached.pool_id == id_ && cached.current >= 0)) {
      return cached.current;
    }
    return currentIndexSlow();
  }

  // Makes `index` current for the calling thread; returns the previous one.
  StreamIndex exchangeCurrentIndex(StreamIndex index);

  uint64_t id() const {
    return id_;
  }

  // Round-robin over worker slots; never leases (CUDA's getStreamFromPool).
  StreamIndex nextPoolIndex();

  // Returns the calling thread's lease, if it holds one, and resets its
  // current slot; the next use leases again. No-op for a thread without one;
  // raises inside a stream guard or after set_stream() to another stream
  // (see exchangeCurrentIndex() in the .cpp).
  void releaseCurrentThreadSlot();

  // Number of worker slots currently leased.
  int leasedSlots() const MPS_EXCLUDES(mu_);
  // Whether the calling thread holds a lease on this pool.
  bool currentThreadHoldsLease() const;
  const ExhaustionConfig& exhaustion() const {
    return options_.exhaustion;
  }

  // Called with the slot index each time a lease comes back (from the
  // returning thread, before the slot is offered to other threads), so the
  // owner can flush work left on that stream.
  void setReleaseHook(std::function<void(StreamIndex)> hook);

  // Raises a clear error in a child process forked after this pool was made.
  // currentIndex() needs no such check on its fast path: the only thread
  // that survives fork() has its cache cleared by the child handler.
  void checkNotForked() const {
    if (C10_UNLIKELY(
            fork_generation_ !=
            fork_generation_counter_.load(std::memory_order_relaxed))) {
      failForked();
    }
  }

 private:
  struct Acquired {
    StreamIndex index;
    bool leased; // false: a shared stream handed out on exhaustion
  };
  // Bumped in the child of every fork(); constant-initialized so the fast
  // path reads it without a guard.
  static std::atomic<uint64_t> fork_generation_counter_;
  static void onForkChild();
  [[noreturn]] static void failForked();
  friend struct ThreadBindings;

  StreamIndex currentIndexSlow();
  Acquired acquireWorkerSlot() MPS_EXCLUDES(mu_);
  // Returns a leased slot to the free list (thread exit or explicit release).
  void returnSlot(StreamIndex index) MPS_EXCLUDES(mu_);
  void validateIndex(StreamIndex index, const char* arg) const;

  const uint64_t id_;
  const uint64_t fork_generation_;
  const StreamPoolOptions options_;
  std::atomic<uint32_t> round_robin_{0};
  std::function<void(StreamIndex)> release_hook_;

  mutable Mutex mu_;
  CondVar slot_freed_;
  // Free worker slots, popped from the back: the lowest index goes first.
  std::vector<StreamIndex> free_slots_ MPS_GUARDED_BY(mu_);
};

// Hooks through which StreamPool creates and drives its streams.
template <typename StreamT>
class StreamBackend {
 public:
  virtual ~StreamBackend() = default;
  // Creates the stream for `index`. May throw; returning null counts as a
  // failure too. Either way the slot stays creatable.
  virtual std::unique_ptr<StreamT> create(StreamIndex index) = 0;
  // Waits for all work submitted to `stream`.
  virtual void synchronize(StreamT& stream) = 0;
  // A lease on `stream` came back; commit what its last owner left.
  virtual void onLeaseReleased(StreamT& stream) = 0;
};

template <typename StreamT>
class StreamPool {
 public:
  StreamPool(
      std::unique_ptr<StreamBackend<StreamT>> backend,
      StreamPoolOptions options)
      : backend_(std::move(backend)), slots_(std::move(options)) {
    TORCH_CHECK(backend_ != nullptr, "StreamPool: backend must not be null");
    slots_.setReleaseHook([this](StreamIndex index) {
      if (StreamT* s = streams_[index].load(std::memory_order_acquire)) {
        backend_->onLeaseReleased(*s);
      }
    });
  }

  // Only harness pools are destroyed; see Note [MPS stream pool]. Members are
  // declared so that slots_ unregisters (and waits out any thread returning a
  // lease) before the streams are deleted, and the backend goes last.
  ~StreamPool() = default;
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  StreamT& stream(StreamIndex index) {
    slots_.checkNotForked();
    TORCH_CHECK(
        index >= 0 && index < kStreamsPerPool,
        "MPS stream index out of range: index=",
        index,
        ", expected 0 <= index < ",
        kStreamsPerPool);
    StreamT* s = streams_[index].load(std::memory_order_acquire);
    return C10_LIKELY(s != nullptr) ? *s : create(index);
  }

  StreamT& defaultStream() {
    return stream(kDefaultStreamIndex);
  }
  StreamT& currentStream() {
    const detail::SlotCache& cached = detail::tls_slot_cache;
    if (C10_LIKELY(cached.pool_id == slots_.id() && cached.stream != nullptr)) {
      return *static_cast<StreamT*>(cached.stream);
    }
    return currentStreamSlow();
  }
  StreamIndex currentIndex() {
    return slots_.currentIndex();
  }
  StreamIndex exchangeCurrentIndex(StreamIndex index) {
    return slots_.exchangeCurrentIndex(index);
  }
  StreamT& streamFromPool() {
    return stream(slots_.nextPoolIndex());
  }
  void releaseCurrentThreadSlot() {
    slots_.releaseCurrentThreadSlot();
  }

  // Calls fn(index, stream) for every stream created so far.
  template <typename Fn>
  void forEachCreatedStream(Fn&& fn) {
    slots_.checkNotForked();
    for (StreamIndex i = 0; i < kStreamsPerPool; ++i) {
      if (StreamT* s = streams_[i].load(std::memory_order_acquire)) {
        fn(i, *s);
      }
    }
  }

  // Waits for the work of every created stream; see Note [MPS stream pool].
  void synchronizeAll() {
    forEachCreatedStream(
        [this](StreamIndex, StreamT& s) { backend_->synchronize(s); });
  }

  bool isCreated(StreamIndex index) const {
    return streams_.at(index).load(std::memory_order_acquire) != nullptr;
  }
  StreamSlotPool& slots() {
    return slots_;
  }

 private:
  // Kept out of the hot accessor so that it stays a few loads.
  C10_NOINLINE StreamT& currentStreamSlow() {
    const StreamIndex index = slots_.currentIndex();
    StreamT& s = stream(index);
    detail::SlotCache& cached = detail::tls_slot_cache;
    if (cached.pool_id == slots_.id() && cached.current == index) {
      cached.stream = &s;
    }
    return s;
  }

  C10_NOINLINE StreamT& create(StreamIndex index) MPS_EXCLUDES(create_mu_) {
    MutexLock lock(create_mu_);
    if (StreamT* s = streams_[index].load(std::memory_order_acquire)) {
      return *s; // another thread won the race
    }
    std::unique_ptr<StreamT> made = backend_->create(index);
    TORCH_CHECK(
        made != nullptr,
        "MPS stream pool: creating the stream for slot ",
        index,
        " failed (no command queue); the slot stays empty and will be "
        "retried on next use");
    StreamT* raw = made.release();
    streams_[index].store(raw, std::memory_order_release);
    return *raw;
  }

  struct OwnedStreams {
    std::array<std::atomic<StreamT*>, kStreamsPerPool> slots{};
    std::atomic<StreamT*>& operator[](StreamIndex i) {
      return slots[i];
    }
    const std::atomic<StreamT*>& at(StreamIndex i) const {
      return slots.at(i);
    }
    ~OwnedStreams() {
      for (auto& s : slots) {
        delete s.load(std::memory_order_acquire);
      }
    }
  };

  const std::unique_ptr<StreamBackend<StreamT>> backend_;
  // Written once per slot under create_mu_, read lock-free after.
  OwnedStreams streams_;
  StreamSlotPool slots_;
  Mutex create_mu_;
};

// RAII: makes a slot current for the calling thread and restores the
// previous one on scope exit, like c10::cuda::CUDAStreamGuard.
template <typename Pool>
class CurrentStreamGuard {
 public:
  CurrentStreamGuard(Pool& pool, StreamIndex index)
      : pool_(pool), previous_(pool.exchangeCurrentIndex(index)) {}
  ~CurrentStreamGuard() {
    pool_.exchangeCurrentIndex(previous_);
  }
  CurrentStreamGuard(const CurrentStreamGuard&) = delete;
  CurrentStreamGuard& operator=(const CurrentStreamGuard&) = delete;

  StreamIndex previous() const {
    return previous_;
  }

 private:
  Pool& pool_;
  const StreamIndex previous_;
};

} // namespace at::mps
