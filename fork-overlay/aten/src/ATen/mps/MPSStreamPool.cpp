#include <ATen/mps/MPSStreamPool.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include <pthread.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

namespace at::mps {

std::optional<bool> parseEnvSwitch(const EnvSwitch& sw, const char* value) {
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  const bool on = std::strcmp(value, "1") == 0;
  TORCH_CHECK(
      on || std::strcmp(value, "0") == 0,
      sw.name,
      "='",
      value,
      "' is not valid. Accepted values: 1 (",
      sw.on,
      "), 0 (",
      sw.off,
      "), or unset (",
      sw.unset,
      ").");
  return on;
}

std::optional<bool> readEnvSwitch(const EnvSwitch& sw) {
  return parseEnvSwitch(sw, std::getenv(sw.name));
}

StreamIndex streamIndexFromId(int64_t stream_id) {
  TORCH_CHECK(
      stream_id >= 0 && stream_id < kStreamsPerPool,
      "Invalid MPS stream id: stream_id=",
      stream_id,
      "; MPS stream ids are pool slot indices 0..",
      kStreamsPerPool - 1,
      " (see Note [MPS stream ids]). Was this c10::Stream made for another "
      "device type?");
  return static_cast<StreamIndex>(stream_id);
}

ExhaustionConfig parseExhaustionConfig(const char* value) {
  if (value == nullptr || *value == '\0') {
    return {};
  }
  // Unlike strtol, from_chars takes no spaces or '+', and fails on overflow.
  int32_t parsed = 0;
  const char* end = value + std::strlen(value);
  const auto [ptr, ec] = std::from_chars(value, end, parsed);
  TORCH_CHECK(
      ec == std::errc() && ptr == end && parsed >= -1,
      kWaitTimeoutEnvVar,
      "='",
      value,
      "' is not valid. Accepted values: unset (share worker streams "
      "round-robin when all are leased), 0 (raise an error at once), -1 "
      "(wait until a stream is released), or a positive number of "
      "milliseconds to wait before raising an error (at most ",
      std::numeric_limits<int32_t>::max(),
      ").");
  if (parsed <= 0) {
    return {parsed == 0 ? ExhaustionPolicy::kThrow : ExhaustionPolicy::kWait};
  }
  return {ExhaustionPolicy::kWaitTimeout, std::chrono::milliseconds(parsed)};
}

StreamPoolOptions StreamPoolOptions::fromEnvironment() {
  return {parseExhaustionConfig(std::getenv(kWaitTimeoutEnvVar))};
}

bool isProcessMainThread() {
#if defined(__APPLE__)
  return pthread_main_np() != 0;
#elif defined(__linux__)
  return static_cast<pid_t>(syscall(SYS_gettid)) == getpid();
#else
  return false;
#endif
}

namespace {

// Process-wide table of live pools, keyed by id. Leaked on purpose: thread
// exit handlers consult it and may run during or after static destruction.
struct PoolRegistry {
  Mutex mu;
  std::unordered_map<uint64_t, StreamSlotPool*> pools MPS_GUARDED_BY(mu);
  uint64_t next_id MPS_GUARDED_BY(mu) = 1;
};

PoolRegistry& registry() {
  static auto* instance = new PoolRegistry();
  return *instance;
}

} // namespace

// All SlotCache writes go here; see Note [MPS main thread lookup].
void StreamSlotPool::setSlotCache(const detail::SlotCache& cache) {
  detail::tls_slot_cache = cache;
  if (ownsMainCache()) {
    main_stream_.store(cache.stream, std::memory_order_relaxed);
    main_key_.store(
        cache.stream != nullptr ? detail::threadWord() : 0,
        std::memory_order_relaxed);
  }
}

std::atomic<uint64_t> StreamSlotPool::fork_generation_counter_{0};

// Poisons every pool made before the fork (Metal objects do not survive
// fork()); pools made in the child work. Clearing the caches of the child's
// only thread sends its next currentIndex() through the checked slow path.
void StreamSlotPool::onForkChild() MPS_NO_THREAD_SAFETY_ANALYSIS {
  fork_generation_counter_.fetch_add(1, std::memory_order_relaxed);
  detail::tls_slot_cache = {0, -1, nullptr};
  for (const auto& entry : registry().pools) {
    entry.second->main_key_.store(0, std::memory_order_relaxed);
    entry.second->main_owner_.store(0, std::memory_order_relaxed);
  }
  registry().mu.unlock();
}

// This thread's binding to each pool it used; see Note [MPS current stream].
struct ThreadBindings {
  struct Binding {
    uint64_t pool_id;
    StreamIndex current; // -1: not chosen yet
    StreamIndex leased; // -1: holds no lease
    bool provisional; // a query's unleased slot; Note [MPS stream queries]
    uint64_t fork_generation; // the pool's
    // Slots replaced by exchanges not yet undone, innermost last.
    std::vector<StreamIndex> displaced;

    // Provisional, no exchange open: uncached; the next op applies the policy.
    bool unsettled() const {
      return provisional && displaced.empty();
    }
  };
  std::vector<Binding> bindings;

  Binding& find(const StreamSlotPool& pool) {
    for (auto& b : bindings) {
      if (b.pool_id == pool.id_) {
        return b;
      }
    }
    return bindings.emplace_back(
        Binding{pool.id_, -1, -1, false, pool.fork_generation_, {}});
  }

  ~ThreadBindings() {
    auto& reg = registry();
    for (const auto& b : bindings) {
      // A fork child leaves the parent's pools: their hook would drive Metal.
      if (StreamSlotPool::forkedSince(b.fork_generation)) {
        continue;
      }
      // The registry lock keeps the pool alive (it unregisters before dying).
      MutexLock lock(reg.mu);
      auto it = reg.pools.find(b.pool_id);
      if (it != reg.pools.end()) {
        if (it->second->ownsMainCache()) { // give the claim up
          it->second->main_key_.store(0, std::memory_order_relaxed);
          it->second->main_owner_.store(0, std::memory_order_release);
        }
        if (b.leased >= 0) {
          it->second->returnSlot(b.leased);
        }
      }
    }
    detail::tls_slot_cache = {0, -1, nullptr};
  }
};

static thread_local ThreadBindings tls_bindings;

StreamSlotPool::StreamSlotPool(
    StreamPoolOptions options,
    std::function<void(StreamIndex)> release_hook)
    : id_([this] {
        auto& reg = registry();
        MutexLock lock(reg.mu);
        reg.pools.emplace(reg.next_id, this);
        return reg.next_id++;
      }()),
      fork_generation_([] {
        // The registry lock is held across fork(), so that the child finds it
        // free and every pool whole.
        static const bool registered =
            pthread_atfork(
                []() MPS_NO_THREAD_SAFETY_ANALYSIS { registry().mu.lock(); },
                []() MPS_NO_THREAD_SAFETY_ANALYSIS { registry().mu.unlock(); },
                onForkChild) == 0;
        TORCH_CHECK(registered, "MPS stream pool: pthread_atfork failed");
        return fork_generation_counter_.load(std::memory_order_relaxed);
      }()),
      options_(std::move(options)),
      release_hook_(std::move(release_hook)),
      free_slots_((uint64_t{1} << kStreamsPerPool) - 2) {} // every worker slot

StreamSlotPool::~StreamSlotPool() {
  auto& reg = registry();
  MutexLock lock(reg.mu);
  reg.pools.erase(id_);
}

// Note [MPS stream queries]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A stream guard (c10's InlineStreamGuard: getStream, then exchangeStream) and
// torch.mps.stream() query the current stream first, binding one on a fresh
// thread that may never encode: autograd runs each MPS backward node on its own
// thread, guarded onto the forward's stream. The exhaustion policy would make
// it wait for (or fail on) an unneeded stream while each worker stream's holder
// awaits its backward pass. So a query (currentIndex(true): getStream, an
// exchange's saved slot) takes a free slot, else an unleased shared one,
// provisional and uncached. The next op outside any exchange applies the policy
// as a first use, maybe moving to a leased slot; ops inside one use its slot.
StreamIndex StreamSlotPool::currentIndexSlow(bool query) {
  checkNotForked();
  ThreadBindings::Binding& b = tls_bindings.find(*this);
  if (b.current < 0 || (!query && b.unsettled())) {
    if (options_.is_main_thread()) {
      b.current = kDefaultStreamIndex;
      // Claims a free pool: the acquire pairs with the previous owner's
      // release at exit, ordering its writes to the copy before this owner's.
      uintptr_t none = 0;
      main_owner_.compare_exchange_strong(
          none, detail::threadWord(), std::memory_order_acquire);
    } else {
      const StreamIndex leased =
          acquireWorkerSlot(query ? ExhaustionConfig{} : options_.exhaustion);
      b.current = leased >= 0 ? leased : nextPoolIndex();
      b.leased = leased;
      b.provisional = query && leased < 0 &&
          options_.exhaustion.policy != ExhaustionPolicy::kShare;
    }
  }
  if (!b.unsettled()) {
    setSlotCache({id_, b.current, nullptr});
  }
  return b.current;
}

StreamIndex StreamSlotPool::acquireWorkerSlot(const ExhaustionConfig& cfg) {
  MutexLock lock(mu_);
  const auto has_free = [this]() MPS_REQUIRES(mu_) { return free_slots_ != 0; };
  if (cfg.policy == ExhaustionPolicy::kShare && !has_free()) {
    return -1;
  }
  if (cfg.policy == ExhaustionPolicy::kWait) {
    slot_freed_.wait(mu_, has_free);
  } else if (cfg.policy == ExhaustionPolicy::kWaitTimeout) {
    slot_freed_.waitFor(mu_, cfg.timeout, has_free);
  }
  TORCH_CHECK(
      has_free(),
      "MPS stream pool exhausted: all ",
      kWorkerStreams,
      " worker streams are leased by other threads, none freed within ",
      kWaitTimeoutEnvVar,
      "=",
      cfg.timeout.count(),
      " ms. Call torch.mps.release_current_thread_slot() in threads that are "
      "done with MPS, unset ",
      kWaitTimeoutEnvVar,
      " to share streams, or set it to -1 or a longer timeout in ms to wait.");
  const StreamIndex slot = __builtin_ctzll(free_slots_);
  free_slots_ &= free_slots_ - 1;
  return slot;
}

void StreamSlotPool::returnSlot(StreamIndex index) {
  release_hook_(index);
  {
    MutexLock lock(mu_);
    free_slots_ |= uint64_t{1} << index;
  }
  slot_freed_.notifyOne();
}

// Guards (c10::StreamGuard, torch.mps.stream) exchange a slot in, then the
// previous one back, via set_stream()'s call. An exchange back to the slot the
// last open exchange replaced closes it; any other opens one. While one is open
// the lease stays, lest the guard restore a slot the thread no longer owns or
// lease one in its destructor (where an exhausted pool can only terminate).
// Known holes, as set_stream() shares that call: set_stream(own) in a guard
// onto `own` closes its entry (a release there succeeds; the exit leases anew);
// set_stream() to the current slot or in a guard opens one nothing closes (a
// later release is refused). Fixing them needs a restore call c10 lacks.
StreamIndex StreamSlotPool::exchangeCurrentIndex(StreamIndex index) {
  checkStreamIndex(index);
  const StreamIndex previous = currentIndex(/*query=*/true);
  ThreadBindings::Binding& b = tls_bindings.find(*this);
  if (!b.displaced.empty() && b.displaced.back() == index) {
    b.displaced.pop_back();
  } else {
    b.displaced.push_back(previous);
  }
  b.current = index;
  setSlotCache(
      b.unsettled() ? detail::SlotCache{0, -1, nullptr}
                    : detail::SlotCache{id_, index, nullptr});
  return previous;
}

StreamIndex StreamSlotPool::nextPoolIndex() {
  checkNotForked();
  const uint32_t n = round_robin_.fetch_add(1, std::memory_order_relaxed);
  return 1 + static_cast<StreamIndex>(n % kWorkerStreams);
}

void StreamSlotPool::releaseCurrentThreadSlot() {
  checkNotForked();
  ThreadBindings::Binding& b = tls_bindings.find(*this);
  if (b.leased < 0) {
    return;
  }
  TORCH_CHECK(
      b.displaced.empty(),
      "torch.mps.release_current_thread_slot(): the calling thread is inside "
      "a stream context (torch.mps.stream(...) or a stream guard) or has set "
      "another stream with torch.mps.set_stream(); call it after leaving the "
      "context or setting the thread's own stream back (current slot ",
      b.current,
      ", leased slot ",
      b.leased,
      ")");
  b.current = -1;
  if (detail::tls_slot_cache.pool_id == id_) {
    setSlotCache({0, -1, nullptr});
  }
  returnSlot(std::exchange(b.leased, -1));
}

bool StreamSlotPool::currentThreadHoldsLease() const {
  return tls_bindings.find(*this).leased > 0;
}

} // namespace at::mps
