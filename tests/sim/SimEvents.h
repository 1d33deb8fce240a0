#pragma once

// StreamEvent backend on the simulator: what MPSEvent.mm does with
// MTLSharedEvent and MPSStream.

#include "SimStream.h"

#include <ATen/mps/MPSEventCore.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <vector>

namespace sim {

class SimEventBackend {
 public:
  using Stream = SimStream;
  using Handle = SharedEventPtr;

  explicit SimEventBackend(Device& device) : device_(device) {}

  Handle makeEvent() {
    Handle h = device_.newSharedEvent();
    std::lock_guard<std::mutex> lock(mu_);
    made_.push_back(h);
    return h;
  }
  // Shared ownership in the simulator: only counted.
  void releaseEvent(const Handle&) {
    std::lock_guard<std::mutex> lock(mu_);
    ++released_;
  }
  uint64_t signaledValue(const Handle& h) {
    return h->signaledValue();
  }
  // Event commands go between passes, so the open encoder ends first.
  void encode(Stream& s, const Handle& h, uint64_t value, bool wait) {
    s.serial([&](Lifecycle& lc) {
      lc.endKernelCoalescing();
      if (wait) {
        lc.commandBuffer()->encodeWait(h, value);
      } else {
        lc.commandBuffer()->encodeSignal(h, value);
      }
    });
  }
  void commit(Stream& s) {
    s.synchronize(at::mps::SyncType::COMMIT);
  }
  void notify(const Handle& h, uint64_t value, std::function<void()> fn) {
    h->notifyListener(value, [fn = std::move(fn)](uint64_t) { fn(); });
  }
  static uint64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Every event made so far, in order, and how many were released.
  std::vector<Handle> made() {
    std::lock_guard<std::mutex> lock(mu_);
    return made_;
  }
  size_t released() {
    std::lock_guard<std::mutex> lock(mu_);
    return released_;
  }

 private:
  Device& device_;
  std::mutex mu_;
  std::vector<Handle> made_;
  size_t released_ = 0;
};

using SimEvent = at::mps::StreamEvent<SimEventBackend>;
using SimEventPool = at::mps::StreamEventPool<SimEventBackend>;

} // namespace sim
