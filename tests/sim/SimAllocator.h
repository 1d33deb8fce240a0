#pragma once

// The allocator core on the simulator: device memory is sim::Buffer (retain
// counts held by in-flight command buffers), stream timelines are the
// SimStreams' command-buffer lifecycles.

#include "SimStream.h"

#include <ATen/mps/MPSAllocatorCore.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace sim {

// Device memory on the simulated device, with a capacity in bytes that is
// exact under concurrency (a failed allocation never overshoots it).
class SimAllocatorBackend : public at::mps::AllocatorBackend {
 public:
  explicit SimAllocatorBackend(Device& device, size_t capacity = SIZE_MAX)
      : device_(device), capacity_(capacity) {}

  void* allocate(int, size_t size, bool) override {
    size_t used = used_.load();
    do {
      if (size > capacity_ || used > capacity_ - size) {
        failed_allocations_.fetch_add(1);
        return nullptr;
      }
    } while (!used_.compare_exchange_weak(used, used + size));
    BufferPtr buffer = device_.newBuffer(1);
    std::lock_guard<std::mutex> lock(mu_);
    live_[buffer.get()] = {size, buffer};
    return buffer.get();
  }
  void release(int, void* buffer) override {
    if (on_release) {
      on_release();
    }
    // The allocator releases only memory the GPU is done with.
    if (gpuReferenced(buffer)) {
      device_.violation("allocator released a buffer still held by the GPU");
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(buffer);
    if (it == live_.end()) {
      device_.violation("allocator released a buffer twice");
      return;
    }
    used_.fetch_sub(it->second.first);
    live_.erase(it);
  }
  const void* key(void* buffer) const override {
    return buffer;
  }
  bool gpuReferenced(void* buffer) const override {
    return static_cast<Buffer*>(buffer)->retainCount() > 1;
  }
  size_t deviceAllocatedSize() const override {
    return used_.load();
  }
  void onAllocationFailed() override {
    if (on_allocation_failed) {
      on_allocation_failed();
    }
  }
  std::string outOfMemoryHint() const override {
    return " (simulated device capacity: " + std::to_string(capacity_) +
        " bytes)";
  }

  // The live buffer behind a handle the allocator returned.
  BufferPtr buffer(void* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.at(handle).second;
  }
  // Bytes and buffers currently held on the device.
  size_t used() const {
    return used_.load();
  }
  size_t live() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  uint64_t failedAllocations() const {
    return failed_allocations_.load();
  }
  // Set before the allocator is shared between threads.
  std::function<void()> on_allocation_failed;
  std::function<void()> on_release;

 private:
  Device& device_;
  const size_t capacity_;
  std::atomic<size_t> used_{0};
  std::atomic<uint64_t> failed_allocations_{0};
  std::mutex mu_;
  // Live buffers: size, and the reference that keeps them alive.
  std::map<const void*, std::pair<size_t, BufferPtr>> live_;
};

// StreamTimelines over the SimStreams of a pool. requestCommit() is
// asynchronous, like a dispatch_async of a commit onto the stream's queue in
// PyTorch: a helper thread commits, so the caller never blocks on a stream
// another thread is encoding on.
class SimTimelines : public at::mps::StreamTimelines {
 public:
  explicit SimTimelines(SimStreamPool& pool)
      : pool_(pool), committer_([this] { commitLoop(); }) {}
  ~SimTimelines() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    committer_.join();
  }

  uint64_t pendingPoint(at::mps::StreamIndex s) override {
    return pool_.stream(s).lifecycle().pendingCommitPoint();
  }
  uint64_t completedPoint(at::mps::StreamIndex s) override {
    return pool_.stream(s).lifecycle().completedCommitPoint();
  }
  void requestCommit(at::mps::StreamIndex s) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!requested_.insert(s).second) {
        return;
      }
      queue_.push_back(s);
    }
    cv_.notify_all();
  }
  void onCompleted(
      at::mps::StreamIndex s,
      uint64_t value,
      std::function<void()> fn) override {
    handlers_->registered.fetch_add(1);
    pool_.stream(s).lifecycle().addTimelineHandler(
        value,
        [handlers = handlers_,
         fn = std::move(fn)](const at::mps::CompletionStatus&) {
          fn();
          handlers->run.fetch_add(1);
        });
  }
  void waitFor(at::mps::StreamIndex s, uint64_t value) override {
    SimStream& stream = pool_.stream(s);
    stream.synchronize(at::mps::SyncType::COMMIT);
    stream.lifecycle().waitForCommitPoint(value);
  }

  // Completion handlers asked for by the allocator / run so far.
  uint64_t handlersRegistered() const {
    return handlers_->registered.load();
  }
  uint64_t handlersRun() const {
    return handlers_->run.load();
  }

  // Blocks until every requested commit has been made.
  void drainCommits() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

 private:
  void commitLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) {
        return;
      }
      const at::mps::StreamIndex s = queue_.front();
      queue_.pop_front();
      requested_.erase(s);
      busy_ = true;
      lock.unlock();
      pool_.stream(s).synchronize(at::mps::SyncType::COMMIT);
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  // Shared with the handlers, which may outlive the timelines.
  struct HandlerCounts {
    std::atomic<uint64_t> registered{0};
    std::atomic<uint64_t> run{0};
  };
  const std::shared_ptr<HandlerCounts> handlers_ =
      std::make_shared<HandlerCounts>();
  SimStreamPool& pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<at::mps::StreamIndex> queue_;
  std::set<at::mps::StreamIndex> requested_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread committer_;
};

} // namespace sim
