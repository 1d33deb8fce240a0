#pragma once

#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <functional>
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
// Backend provides (each encode/commit enters the stream's serial section):
//   using Stream; using Handle;  (the shared event, owned by the event)
//   Handle makeEvent(); void releaseEvent(const Handle&); uint64_t nowNs();
//   uint64_t signaledValue(const Handle&);
//   void encodeSignal/encodeWait(Stream&, const Handle&, uint64_t value);
//   void commit(Stream&);  (synchronize(COMMIT))
//   void notify(const Handle&, uint64_t value, std::function<void()>);
template <typename Backend>
class StreamEvent {
 public:
  using Stream = typename Backend::Stream;
  using Handle = typename Backend::Handle;

  StreamEvent(Backend* backend, uint64_t id, bool enable_timing)
      : backend_(backend),
        id_(id),
        handle_(backend->makeEvent()),
        timing_(enable_timing),
        state_(std::make_shared<Completion>()) {}

  ~StreamEvent() {
    backend_->releaseEvent(handle_);
  }

  void record(Stream& stream, bool commit) MPS_EXCLUDES(mu_) {
    uint64_t value = 0;
    bool timing = false;
    {
      MutexLock lock(mu_);
      value = ++counter_;
      timing = timing_;
    }
    // Registered before the signal: notifyListener:atValue:block: documents
    // when a listener runs only for a value not yet reached.
    if (timing) {
      notifyCompletion(value, /*record_time=*/true);
    }
    backend_->encodeSignal(stream, handle_, value);
    {
      MutexLock lock(mu_);
      if (value > recorded_) {
        recorded_ = value;
        recorded_stream_ = &stream;
      }
    }
    if (commit) {
      backend_->commit(stream);
    }
  }

  // GPU-side wait on `stream`; false when there is nothing to wait for.
  bool wait(Stream& stream, bool commit) MPS_EXCLUDES(mu_) {
    const Pending p = pending();
    if (!p.producer) {
      return false;
    }
    if (p.producer != &stream) {
      backend_->commit(*p.producer);
    }
    backend_->encodeWait(stream, handle_, p.value);
    if (commit) {
      backend_->commit(stream);
    }
    return true;
  }

  // False if never recorded, as torch.mps.Event.query() always answered.
  bool query() const MPS_EXCLUDES(mu_) {
    const uint64_t value = recorded();
    return value != 0 && backend_->signaledValue(handle_) >= value;
  }

  void synchronize() MPS_EXCLUDES(mu_) {
    const Pending p = pending();
    if (!p.producer) {
      return;
    }
    backend_->commit(*p.producer);
    notifyCompletion(p.value, /*record_time=*/false);
    // Whether Metal notifies a listener registered after the value was
    // reached is not documented, so the value is polled as well.
    std::shared_ptr<Completion> state = completion();
    while (!state->waitFor(p.value, std::chrono::milliseconds(2))) {
      if (backend_->signaledValue(handle_) >= p.value) {
        return;
      }
    }
  }

  double elapsedMsSince(StreamEvent& start) {
    TORCH_CHECK(
        start.timingEnabled() && timingEnabled(),
        "Events were not created with argument 'enable_timing=True'");
    start.synchronize();
    synchronize();
    constexpr auto kNotificationTimeout = std::chrono::seconds(10);
    const uint64_t t0 = start.completionTimeNs(kNotificationTimeout);
    const uint64_t t1 = completionTimeNs(kNotificationTimeout);
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
    MutexLock lock(mu_);
    recorded_ = 0;
    recorded_stream_ = nullptr;
    timing_ = enable_timing;
    state_ = std::make_shared<Completion>();
  }

  bool timingEnabled() const MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return timing_;
  }

  // Completion time of the last recorded value (0 if never), which
  // synchronize() saw reached; waits up to `timeout` for its notification.
  uint64_t completionTimeNs(std::chrono::nanoseconds timeout) const
      MPS_EXCLUDES(mu_) {
    const uint64_t value = recorded();
    return value == 0 ? 0 : completion()->waitForTimeOf(value, timeout);
  }

 private:
  friend struct StreamEventTestPeer;

  uint64_t recorded() const MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return recorded_;
  }

  // The recorded value not yet reached and its stream (null if none).
  struct Pending {
    uint64_t value;
    Stream* producer;
  };
  Pending pending() const MPS_EXCLUDES(mu_) {
    Pending p{0, nullptr};
    {
      MutexLock lock(mu_);
      p = {recorded_, recorded_stream_};
    }
    if (p.value == 0 || backend_->signaledValue(handle_) >= p.value) {
      return {0, nullptr};
    }
    return p;
  }

  class Completion {
   public:
    void reached(uint64_t value, uint64_t time_ns) MPS_EXCLUDES(mu_) {
      MutexLock lock(mu_);
      if (value > reached_) {
        reached_ = value;
      }
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
    // 0 if no time for `value` came within `timeout`.
    uint64_t waitForTimeOf(uint64_t value, std::chrono::nanoseconds timeout)
        MPS_EXCLUDES(mu_) {
      MutexLock lock(mu_);
      cv_.waitFor(mu_, timeout, [&]() MPS_REQUIRES(mu_) {
        return times_.count(value) != 0;
      });
      auto it = times_.find(value);
      return it == times_.end() ? 0 : it->second;
    }

   private:
    mutable Mutex mu_;
    CondVar cv_;
    uint64_t reached_ MPS_GUARDED_BY(mu_) = 0;
    std::map<uint64_t, uint64_t> times_ MPS_GUARDED_BY(mu_);
  };

  std::shared_ptr<Completion> completion() const MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return state_;
  }

  void notifyCompletion(uint64_t value, bool record_time) MPS_EXCLUDES(mu_) {
    std::shared_ptr<Completion> state = completion();
    Backend* backend = backend_;
    backend_->notify(handle_, value, [state, value, record_time, backend]() {
      state->reached(value, record_time ? backend->nowNs() : 0);
    });
  }

  Backend* const backend_;
  // Written only by resetForReuse(), while the pool owns the event alone.
  uint64_t id_;
  const Handle handle_;

  mutable Mutex mu_;
  uint64_t counter_ MPS_GUARDED_BY(mu_) = 0;
  uint64_t recorded_ MPS_GUARDED_BY(mu_) = 0; // 0: not recorded
  Stream* recorded_stream_ MPS_GUARDED_BY(mu_) = nullptr;
  bool timing_ MPS_GUARDED_BY(mu_);
  std::shared_ptr<Completion> state_ MPS_GUARDED_BY(mu_);
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
    std::unique_ptr<Event> event = free_->pop();
    MutexLock lock(mu_);
    const uint64_t id = ++next_id_;
    if (event) {
      event->resetForReuse(id, enable_timing);
    } else {
      event = std::make_unique<Event>(backend_, id, enable_timing);
    }
    std::shared_ptr<FreeList> free_list = free_;
    in_use_.emplace(
        id, std::shared_ptr<Event>(event.release(), [free_list](Event* e) {
          free_list->push(std::unique_ptr<Event>(e));
        }));
    return id;
  }

  void release(uint64_t id) MPS_EXCLUDES(mu_) {
    std::shared_ptr<Event> event;
    {
      MutexLock lock(mu_);
      auto it = in_use_.find(id);
      TORCH_CHECK(it != in_use_.end(), "Invalid MPS event id: event_id=", id);
      event = std::move(it->second);
      in_use_.erase(it);
    }
    // Dropped outside the lock.
  }

  std::shared_ptr<Event> get(uint64_t id) const MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = in_use_.find(id);
    TORCH_CHECK(it != in_use_.end(), "Invalid MPS event id: event_id=", id);
    return it->second;
  }

  void emptyCache() {
    free_->clear();
  }

 private:
  class FreeList {
   public:
    void push(std::unique_ptr<Event> e) MPS_EXCLUDES(mu_) {
      MutexLock lock(mu_);
      events_.push_back(std::move(e));
    }
    std::unique_ptr<Event> pop() MPS_EXCLUDES(mu_) {
      MutexLock lock(mu_);
      if (events_.empty()) {
        return nullptr;
      }
      auto e = std::move(events_.back());
      events_.pop_back();
      return e;
    }
    void clear() MPS_EXCLUDES(mu_) {
      std::vector<std::unique_ptr<Event>> dropped;
      {
        MutexLock lock(mu_);
        dropped.swap(events_);
      }
    }

   private:
    mutable Mutex mu_;
    std::vector<std::unique_ptr<Event>> events_ MPS_GUARDED_BY(mu_);
  };

  Backend* const backend_;
  const std::shared_ptr<FreeList> free_;
  mutable Mutex mu_;
  uint64_t next_id_ MPS_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, std::shared_ptr<Event>> in_use_
      MPS_GUARDED_BY(mu_);
};

} // namespace at::mps
