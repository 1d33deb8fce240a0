#pragma once

#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace at::mps {

// Note [MPS environment switches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An on/off variable is "1" or "0"; unset or empty means the default. Anything
// else (" 1", "true") raises, naming the variable and each value's effect, so a
// typo never silently selects the default. Its owner reads it once, lazily.
struct EnvSwitch {
  const char* name;
  const char *on, *off, *unset; // what "1", "0" and leaving it unset do
};

TORCH_API std::optional<bool> parseEnvSwitch(const EnvSwitch&, const char*);
TORCH_API std::optional<bool> readEnvSwitch(const EnvSwitch& sw);

// Note [MPS stream pool]
// ~~~~~~~~~~~~~~~~~~~~~~
// kStreamsPerPool streams, each with its own command queue: slot 0 is the
// default stream, the rest worker streams. A slot's stream is created on first
// use; a failure leaves it empty for a retry. Tests simulate StreamT.
//
// The main thread starts on the default stream (Note [MPS current stream]);
// others lease a free worker slot on first use until they exit or call
// releaseCurrentThreadSlot(), else ExhaustionPolicy applies. A lease is not
// a lock: shared streams, getStreamFromPool(), guards and cross-thread
// tensors share streams across threads, so stream code must be thread-safe.
//
// The production pool is leaked, like CUDA's streams: static destructors may
// run after the Metal runtime is gone, and threads may hold leases at exit.

constexpr int kStreamsPerPool = 32;
constexpr int kDefaultStreamIndex = 0;
constexpr int kWorkerStreams = kStreamsPerPool - 1;

using StreamIndex = int;

inline void checkStreamIndex(StreamIndex index) {
  TORCH_CHECK(
      index >= 0 && index < kStreamsPerPool,
      "MPS stream index out of range: index=",
      index,
      ", expected 0 <= index < ",
      kStreamsPerPool);
}

// Note [MPS stream ids]
// ~~~~~~~~~~~~~~~~~~~~~
// An MPS c10::Stream's StreamId is its pool slot index: id 0 is the default
// stream, ids are never negative, and any other id is rejected by name.
static_assert(kDefaultStreamIndex == 0, "id 0 must stay the default stream");

TORCH_API StreamIndex streamIndexFromId(int64_t stream_id);

constexpr const char* kWaitTimeoutEnvVar = "MPS_STREAM_POOL_WAIT_TIMEOUT_MS";

// What a thread's first use does when every worker slot is leased.
enum class ExhaustionPolicy {
  kShare, // unset: share a worker stream round-robin, as CUDA; never fails
  kThrow, // "0": throw at once
  kWait, // "-1": block until a slot is released
  kWaitTimeout, // "N" > 0: block up to N ms, then throw
};

struct ExhaustionConfig {
  ExhaustionPolicy policy = ExhaustionPolicy::kShare;
  std::chrono::milliseconds timeout{0}; // kWaitTimeout's wait; kThrow: 0
};

// nullptr or "": unset; else a decimal int32 >= -1 (raises otherwise).
TORCH_API ExhaustionConfig parseExhaustionConfig(const char* value);

TORCH_API bool isProcessMainThread();

struct StreamPoolOptions {
  ExhaustionConfig exhaustion;
  std::function<bool()> is_main_thread = isProcessMainThread;

  static StreamPoolOptions fromEnvironment();
};

namespace detail {
// The cache of Note [MPS current stream], constant-initialized: a TLS load. A
// copy in a library that only inlines the readers stays empty: slow, correct.
struct SlotCache {
  uint64_t pool_id;
  int current; // StreamIndex; -1: no binding
  void* stream; // null until StreamPool::currentStreamSlow() sets it
};
inline thread_local SlotCache tls_slot_cache = {0, -1, nullptr};

// Note [MPS main thread lookup]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In a shared library such as libtorch a thread_local read is a call
// (__tls_get_addr on Linux, the TLV thunk on macOS), where the global stream
// this pool replaced was a load. So the first main thread (is_main_thread)
// to bind a pool claims it (main_owner_), and while its SlotCache holds that
// pool's stream, the pool keeps a copy (main_stream_) under a key, the
// owner's thread pointer (a register): one compare in currentStream().
// - Only the owner writes the copy, with its tls_slot_cache, so both agree;
//   others only compare the key (atomic: compilers may load speculatively).
// - The owner gives its claims up at exit, before its thread pointer can be
//   reused (a thread's exit precedes the creation of one reusing it); the
//   fork child handler clears every pool's.
#if defined(__APPLE__) && defined(__aarch64__)
constexpr bool kThreadWordKnown = true;
// The TSD base; the low 3 bits may hold the CPU (xnu's _os_tsd_get_base).
inline uintptr_t threadWord() {
  uintptr_t tsd;
  asm volatile("mrs %0, TPIDRRO_EL0" : "=r"(tsd));
  return tsd & ~uintptr_t{7};
}
#elif defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
constexpr bool kThreadWordKnown = true;
inline uintptr_t threadWord() {
  return reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
}
#else
constexpr bool kThreadWordKnown = false;
inline uintptr_t threadWord() {
  return 0; // so no pool is claimed
}
#endif
} // namespace detail

// Note [MPS current stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A thread's binding to a pool holds its current and leased slots. The fast
// path reads a trivially destructible cache of the last pool's binding: compare
// the pool id, load the index. A second thread_local holds the full list; its
// destructor returns leases at thread exit. Pools have process-unique ids, not
// addresses, so a destroyed test pool and a new one at its address are never
// confused, and a thread exiting after its pool unregistered returns nothing.
class TORCH_API StreamSlotPool {
 public:
  // A thread returning a lease runs `release_hook(slot)` before re-offering it.
  StreamSlotPool(
      StreamPoolOptions options,
      std::function<void(StreamIndex)> release_hook);
  ~StreamSlotPool();

  // A `query` never waits or throws (Note [MPS stream queries]).
  StreamIndex currentIndex(bool query = false) {
    const detail::SlotCache cached = detail::tls_slot_cache;
    if (C10_LIKELY(cached.pool_id == id_ && cached.current >= 0)) {
      return cached.current;
    }
    return currentIndexSlow(query);
  }

  StreamIndex exchangeCurrentIndex(StreamIndex index);

  // Round-robin over worker slots; never leases (CUDA's getStreamFromPool).
  StreamIndex nextPoolIndex();

  // The thread's next use leases again. Raises inside a stream guard or after
  // set_stream() to another stream (see exchangeCurrentIndex()).
  void releaseCurrentThreadSlot();

  bool currentThreadHoldsLease() const;

  // Raises in a child forked after this pool was made; see onForkChild().
  void checkNotForked() const {
    TORCH_CHECK(
        !forkedSince(fork_generation_),
        "MPS cannot be used in a child process created by fork() after the "
        "MPS stream pool was initialized in the parent. Use the 'spawn' or "
        "'forkserver' multiprocessing start method.");
  }

 private:
  static std::atomic<uint64_t> fork_generation_counter_;
  static bool forkedSince(uint64_t generation) {
    return generation !=
        fork_generation_counter_.load(std::memory_order_relaxed);
  }
  static void onForkChild();
  friend struct ThreadBindings;
  template <typename StreamT>
  friend class StreamPool;
  friend struct StreamSlotPoolTestPeer;

  StreamIndex currentIndexSlow(bool query);
  void setSlotCache(const detail::SlotCache& cache);
  bool ownsMainCache() const {
    return detail::kThreadWordKnown &&
        main_owner_.load(std::memory_order_relaxed) == detail::threadWord();
  }
  // The leased slot; -1 when none is free and `cfg` shares a stream instead.
  StreamIndex acquireWorkerSlot(const ExhaustionConfig& cfg) MPS_EXCLUDES(mu_);
  void returnSlot(StreamIndex index) MPS_EXCLUDES(mu_);

  const uint64_t id_;
  const uint64_t fork_generation_;
  const StreamPoolOptions options_;
  std::atomic<uint32_t> round_robin_{0};
  const std::function<void(StreamIndex)> release_hook_;

  Mutex mu_;
  CondVar slot_freed_;
  // Bit i set: worker slot i is free. The lowest is leased first.
  uint64_t free_slots_ MPS_GUARDED_BY(mu_);
  static_assert(kStreamsPerPool < 64, "free_slots_ has a bit per slot");

  // Note [MPS main thread lookup]; 0: unclaimed, or no copy (main_key_).
  std::atomic<uintptr_t> main_owner_{0};
  std::atomic<uintptr_t> main_key_{0};
  std::atomic<void*> main_stream_{nullptr};
};

// Hooks through which StreamPool creates and drives its streams.
template <typename StreamT>
struct StreamBackend {
  virtual ~StreamBackend() = default;
  // May throw or return null; either way the slot stays creatable.
  virtual std::unique_ptr<StreamT> create(StreamIndex index) = 0;
  virtual void synchronize(StreamT& stream) = 0;
  // Commits what the last owner of a returned lease left.
  virtual void onLeaseReleased(StreamT& stream) = 0;
};

template <typename StreamT>
class StreamPool {
 public:
  StreamPool(
      std::unique_ptr<StreamBackend<StreamT>> backend,
      StreamPoolOptions options)
      : backend_(std::move(backend)),
        slots_(std::move(options), [this](StreamIndex index) {
          if (StreamT* s = streams_[index].load(std::memory_order_acquire)) {
            backend_->onLeaseReleased(*s);
          }
        }) {
    TORCH_CHECK(backend_ != nullptr, "StreamPool: backend must not be null");
  }

  StreamT& stream(StreamIndex index) {
    slots_.checkNotForked();
    checkStreamIndex(index);
    StreamT* s = streams_[index].load(std::memory_order_acquire);
    return C10_LIKELY(s != nullptr) ? *s : create(index);
  }

  // `query`: see StreamSlotPool::currentIndex().
  StreamT& currentStream(bool query = false) {
    if (detail::kThreadWordKnown &&
        slots_.main_key_.load(std::memory_order_relaxed) ==
            detail::threadWord()) {
      return *static_cast<StreamT*>(
          slots_.main_stream_.load(std::memory_order_relaxed));
    }
    return threadCurrentStream(query);
  }

  void synchronizeAll() {
    slots_.checkNotForked();
    for (StreamIndex i = 0; i < kStreamsPerPool; ++i) {
      if (StreamT* s = streams_[i].load(std::memory_order_acquire)) {
        backend_->synchronize(*s);
      }
    }
  }

  StreamSlotPool& slots() {
    return slots_;
  }

 private:
  // Out of line: a thread_local read in a shared library is a call, and
  // inlined it would make the main thread's path save registers around it.
  C10_NOINLINE StreamT& threadCurrentStream(bool query) {
    const detail::SlotCache& cached = detail::tls_slot_cache;
    return C10_LIKELY(cached.pool_id == slots_.id_ && cached.stream)
        ? *static_cast<StreamT*>(cached.stream)
        : currentStreamSlow(query);
  }

  // Kept out of the hot accessor so that it stays a few loads.
  C10_NOINLINE StreamT& currentStreamSlow(bool query) {
    const StreamIndex index = slots_.currentIndex(query);
    StreamT& s = stream(index);
    const detail::SlotCache& c = detail::tls_slot_cache;
    if (c.pool_id == slots_.id_ && c.current == index) {
      slots_.setSlotCache({slots_.id_, index, &s});
    }
    return s;
  }

  C10_NOINLINE StreamT& create(StreamIndex index) MPS_EXCLUDES(create_mu_) {
    MutexLock lock(create_mu_);
    if (StreamT* s = streams_[index].load(std::memory_order_acquire)) {
      return *s; // another thread won the race
    }
    owned_[index] = backend_->create(index);
    TORCH_CHECK(
        owned_[index] != nullptr,
        "MPS stream pool: creating the stream for slot ",
        index,
        " failed (no command queue); the slot stays empty and will be "
        "retried on next use");
    streams_[index].store(owned_[index].get(), std::memory_order_release);
    return *owned_[index];
  }

  // Only tests destroy pools; see Note [MPS stream pool]. Members are
  // declared so that slots_ unregisters (and waits out any thread returning a
  // lease) before the streams are deleted, and the backend goes last.
  const std::unique_ptr<StreamBackend<StreamT>> backend_;
  // Written once per slot under create_mu_, read lock-free after.
  std::array<std::atomic<StreamT*>, kStreamsPerPool> streams_{};
  std::array<std::unique_ptr<StreamT>, kStreamsPerPool> owned_
      MPS_GUARDED_BY(create_mu_);
  StreamSlotPool slots_;
  Mutex create_mu_;
};

} // namespace at::mps
