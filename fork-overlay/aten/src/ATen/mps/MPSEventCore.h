#pragma once

#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace at::mps {

// Note [MPS event values]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A Metal shared event's value only rises (smaller signals and CPU writes are
// ignored), so zeroing it for reuse would leave it looking signalled and skip
// waits. So each record() takes the next value of the event's own counter,
// kept across pool reuse; "not recorded" is a state, not value 0.
//
// record(stream) and wait(stream) act on the given stream, whatever stream
// made the event. A wait first commits the recording stream, never blocking
// on a signal in an uncommitted buffer. Re-recording replaces the captured
// work, as in CUDA. Notification callbacks (timing, synchronize) hold only
// the shared completion state, never the (possibly re-pooled) event.
//
// Backend provides types Stream and Handle (the shared event, owned by the
// event), makeEvent(), releaseEvent(h), uint64_t signaledValue(h), static
// uint64_t nowNs(), notify(h, value, std::function<void()>), and, entering the
// stream's serial section, encode(stream, h, value, bool wait) and
// commit(stream) (synchronize(COMMIT)).
template <typename Backend>
class StreamEvent {
 public:
  using Stream = typename Backend::Stream;
  using Handle = typename Backend::Handle;

  StreamEvent(Backend* backend, uint64_t id, bool enable_timing)
      : backend_(backend),
        handle_(backend->makeEvent()),
        id_(id),
        timing_(enable_timing),
        state_(std::make_shared<Completion>()) {}

  ~StreamEvent() {
    backend_->releaseEvent(handle_);
  }

  void record(Stream& stream, bool commit) MPS_EXCLUDES(mu_) {
    const uint64_t value = ++counter_;
    // Registered before the signal: notifyListener:atValue:block: documents
    // when a listener runs only for a value not yet reached.
    if (timing_) {
      notifyCompletion(value, /*record_time=*/true);
    }
    backend_->encode(stream, handle_, value, /*wait=*/false);
    {
      MutexLock lock(mu_);
      if (value > recorded_.value) {
        recorded_ = {value, &stream};
      }
    }
    if (commit) {
      backend_->commit(stream);
    }
  }

  // GPU-side wait on `stream`; false when there is nothing to wait for.
  bool wait(Stream& stream, bool commit) MPS_EXCLUDES(mu_) {
    const Recorded p = pending();
    if (!p.stream) {
      return false;
    }
    if (p.stream != &stream) {
      backend_->commit(*p.stream);
    }
    backend_->encode(stream, handle_, p.value, /*wait=*/true);
    if (commit) {
      backend_->commit(stream);
    }
    return true;
  }

  // False if never recorded, as torch.mps.Event.query() always answered.
  bool query() const MPS_EXCLUDES(mu_) {
    const uint64_t value = recorded().value;
    return value != 0 && backend_->signaledValue(handle_) >= value;
  }

  void synchronize() MPS_EXCLUDES(mu_) {
    const Recorded p = pending();
    if (!p.stream) {
      return;
    }
    backend_->commit(*p.stream);
    notifyCompletion(p.value, /*record_time=*/false);
    // Whether Metal notifies a listener registered after the value was
    // reached is not documented, so the value is polled as well.
    while (!state_->waitFor(p.value, std::chrono::milliseconds(2)) &&
           backend_->signaledValue(handle_) < p.value) {
    }
  }

  double elapsedMsSince(StreamEvent& start) {
    TORCH_CHECK(
        start.timing_ && timing_,
        "Events were not created with argument 'enable_timing=True'");
    start.synchronize();
    synchronize();
    const uint64_t t0 = start.completionTimeNs();
    const uint64_t t1 = completionTimeNs();
    TORCH_CHECK(
        t0 > 0 && t1 > 0,
        "Both events must be recorded before calculating elapsed time (or "
        "Metal did not deliver an event's timing notification within 10 s).");
    TORCH_CHECK(
        t1 >= t0,
        "End event ",
        id_,
        " was not recorded after start event ",
        start.id_);
    return static_cast<double>(t1 - t0) * 1e-6;
  }

  // Makes the event look new to its next owner; the Metal value stays.
  void resetForReuse(uint64_t id, bool enable_timing) MPS_EXCLUDES(mu_) {
    id_ = id;
    timing_ = enable_timing;
    state_ = std::make_shared<Completion>();
    MutexLock lock(mu_);
    recorded_ = {};
  }

  // Completion time of the last recorded value (0 if never), which
  // synchronize() saw reached; waits for its notification.
  uint64_t completionTimeNs() const MPS_EXCLUDES(mu_) {
    const uint64_t value = recorded().value;
    return value == 0 ? 0 : state_->waitForTimeOf(value);
  }

 private:
  friend struct StreamEventTestPeer;

  // The last recorded value (0: not recorded) and its stream.
  struct Recorded {
    uint64_t value = 0;
    Stream* stream = nullptr;
  };
  Recorded recorded() const MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return recorded_;
  }
  // recorded() if its value is not reached yet, else {}.
  Recorded pending() const MPS_EXCLUDES(mu_) {
    const Recorded r = recorded();
    const bool reached =
        r.value == 0 || backend_->signaledValue(handle_) >= r.value;
    return reached ? Recorded{} : r;
  }

  class Completion {
   public:
    void reached(uint64_t value, uint64_t time_ns) MPS_EXCLUDES(mu_) {
      MutexLock lock(mu_);
      reached_ = std::max(reached_, value);
      if (time_ns != 0) {
        times_[value] = time_ns;
      }
      cv_.notifyAll();
    }
    bool waitFor(uint64_t value, std::chrono::nanoseconds timeout)
        MPS_EXCLUDES(mu_) {
      MutexLock lock(mu_);
      return cv_.waitFor(
          mu_, timeout, [&]() MPS_REQUIRES(mu_) { return reached_ >= value; });
    }
    // 0 if no time for `value` came within 10 s.
    uint64_t waitForTimeOf(uint64_t value) MPS_EXCLUDES(mu_) {
      MutexLock lock(mu_);
      const auto timeout = std::chrono::seconds(10);
      const bool arrived = cv_.waitFor(mu_, timeout, [&]() MPS_REQUIRES(mu_) {
        return times_.count(value) != 0;
      });
      return arrived ? times_.at(value) : 0;
    }

   private:
    mutable Mutex mu_;
    CondVar cv_;
    uint64_t reached_ MPS_GUARDED_BY(mu_) = 0;
    std::map<uint64_t, uint64_t> times_ MPS_GUARDED_BY(mu_);
  };

  void notifyCompletion(uint64_t value, bool record_time) MPS_EXCLUDES(mu_) {
    backend_->notify(handle_, value, [state = state_, value, record_time]() {
      state->reached(value, record_time ? Backend::nowNs() : 0);
    });
  }

  Backend* const backend_;
  const Handle handle_;
  // Written only by resetForReuse(), while the pool owns the event alone.
  uint64_t id_;
  bool timing_;
  std::shared_ptr<Completion> state_;

  std::atomic<uint64_t> counter_{0};
  mutable Mutex mu_;
  Recorded recorded_ MPS_GUARDED_BY(mu_);
};

// Note [MPS event pool]
// ~~~~~~~~~~~~~~~~~~~~~
// Python and c10::Event hold events as never-reused ids. Each operation holds
// a shared_ptr to its event, so a concurrent release cannot free it
// underneath; the last holder returns it to the free list.
template <typename Backend>
class StreamEventPool {
 public:
  using Event = StreamEvent<Backend>;

  explicit StreamEventPool(Backend* backend)
      : backend_(backend), free_(std::make_shared<FreeList>()) {}

  uint64_t acquire(bool enable_timing) MPS_EXCLUDES(mu_) {
    std::unique_ptr<Event> event;
    {
      MutexLock lock(free_->mu);
      if (!free_->events.empty()) {
        event = std::move(free_->events.back());
        free_->events.pop_back();
      }
    }
    MutexLock lock(mu_);
    const uint64_t id = ++next_id_;
    if (event) {
      event->resetForReuse(id, enable_timing);
    } else {
      event = std::make_unique<Event>(backend_, id, enable_timing);
    }
    in_use_.emplace(
        id, std::shared_ptr<Event>(event.release(), [free = free_](Event* e) {
          MutexLock lock(free->mu);
          free->events.emplace_back(e);
        }));
    return id;
  }

  void release(uint64_t id) MPS_EXCLUDES(mu_) {
    typename decltype(in_use_)::node_type event; // dropped after unlocking
    MutexLock lock(mu_);
    event = in_use_.extract(id);
    TORCH_CHECK(!event.empty(), "Invalid MPS event id: event_id=", id);
  }

  std::shared_ptr<Event> get(uint64_t id) const MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = in_use_.find(id);
    TORCH_CHECK(it != in_use_.end(), "Invalid MPS event id: event_id=", id);
    return it->second;
  }

  void emptyCache() MPS_EXCLUDES(free_->mu) {
    std::vector<std::unique_ptr<Event>> dropped; // freed after unlocking
    MutexLock lock(free_->mu);
    dropped.swap(free_->events);
  }

 private:
  struct FreeList {
    Mutex mu;
    std::vector<std::unique_ptr<Event>> events MPS_GUARDED_BY(mu);
  };

  Backend* const backend_;
  const std::shared_ptr<FreeList> free_;
  mutable Mutex mu_;
  uint64_t next_id_ MPS_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, std::shared_ptr<Event>> in_use_
      MPS_GUARDED_BY(mu_);
};

} // namespace at::mps
