#pragma once

// A simulated Metal runtime for the MPS stream-pool harness.
//
// It models the contract in shared/METAL-SEMANTICS.md, not just the
// signatures:
//  - a queue runs committed command buffers ("roots") on its own simulated
//    GPU thread, one after another in commit order, each taking a seeded
//    random latency; different queues run concurrently, unordered;
//  - completed handlers run on one device-wide completion thread, after the
//    GPU work, also when the buffer failed; optionally delivered out of
//    order (seeded) to exercise code that must not assume ordering;
//  - the command-buffer state machine aborts on illegal transitions (second
//    commit, encoding or adding handlers after commit, committing with an open
//    encoder, two open encoders, encoding from two threads at once, waiting on
//    an uncommitted root);
//  - makeCommandBuffer blocks while a queue has maxInflight uncompleted
//    buffers;
//  - encoded buffers are retained (+1) until the command buffer completes;
//  - shared events hold a monotonic 64-bit value; GPU waits can be encoded on
//    any queue before the signal exists and time out into an error; CPU
//    notifications run on a listener thread;
//  - faults: queue creation fails, command buffers complete with an error;
//  - a hazard detector (see SimHazards) records every way GPU work on one
//    queue can race with another queue or with the allocator.
//
// Violations of the contract go to a handler that aborts by default, like the
// real driver; tests that expect one install a recording handler.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace sim {

class Device;
class Queue;
class Root;

struct Config {
  uint64_t seed = 1;
  // Each committed root takes a GPU time drawn uniformly from this range.
  std::chrono::microseconds min_latency{0};
  std::chrono::microseconds max_latency{0};
  size_t max_inflight = 64; // per queue, as Metal's default
  // How many command buffers the simulated GPU executes at once across all
  // queues (0: unlimited). Benchmarks set it so that more queues cannot buy
  // more GPU than the device has.
  size_t gpu_parallelism = 0;
  // Probability that the completion thread swaps the delivery of two
  // adjacent completions.
  double reorder_completions = 0.0;
  // Encoded resources are retained until completion (Metal's default). In
  // unretained mode retainCount() stays at the owner's count.
  bool retained_references = true;
  std::chrono::milliseconds event_wait_timeout{5000};
  // Yields inside every encoding call so overlapping encoders are caught.
  bool widen_encode_windows = false;
};

enum class Access { kRead, kWrite };

// A GPU buffer with real contents and a retain count. The contents come in
// two independent views: int64 words (read/write, for the simulator's own
// tests) and `bytes` of raw memory (contents(), what MTLBuffer.contents maps
// for the Objective-C face in tests/metal).
class Buffer {
 public:
  // `external`: memory the buffer wraps instead of its own byte view, as
  // newBufferWithBytesNoCopy: does; the caller keeps it alive.
  Buffer(
      Device* device,
      uint64_t id,
      size_t words,
      size_t bytes = 0,
      unsigned char* external = nullptr);
  uint64_t id() const {
    return id_;
  }
  size_t words() const {
    return words_;
  }
  size_t bytes() const {
    return bytes_;
  }
  // The byte view, zeroed on first use. Unsynchronised memory like a real
  // shared buffer: the CPU and GPU work must be ordered by their users.
  unsigned char* contents();
  // +1 for the owner, +1 per in-flight command buffer that encoded it.
  int retainCount() const {
    return retain_count_.load(std::memory_order_acquire);
  }
  int64_t read(size_t i) const;
  void write(size_t i, int64_t v);

 private:
  friend class CommandBuffer;
  friend class Queue;
  Device* device_;
  const uint64_t id_;
  const size_t words_;
  const size_t bytes_;
  std::atomic<int> retain_count_{1};
  std::unique_ptr<std::atomic<int64_t>[]> data_;
  std::once_flag contents_once_;
  std::unique_ptr<unsigned char[]> contents_;
  unsigned char* const external_;
};
using BufferPtr = std::shared_ptr<Buffer>;

class SharedEvent {
 public:
  explicit SharedEvent(Device* device) : device_(device) {}
  uint64_t signaledValue() const;
  // CPU write: ignored unless larger than the current value.
  void setSignaledValue(uint64_t value);
  // Runs `fn` on the listener thread once the value reaches `value`
  // (immediately queued if it already has).
  void notifyListener(uint64_t value, std::function<void(uint64_t)> fn);
  // Blocks until the value reaches `value` or the timeout passes.
  bool waitFor(uint64_t value, std::chrono::milliseconds timeout) const;

 private:
  Device* device_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  uint64_t value_ = 0;
  std::multimap<uint64_t, std::function<void(uint64_t)>> listeners_;
};
using SharedEventPtr = std::shared_ptr<SharedEvent>;

struct Kernel {
  std::vector<std::pair<BufferPtr, Access>> uses;
  std::function<void()> body; // runs on the simulated GPU
};

enum class RootState { kOpen, kCommitted, kCompleted, kError };

struct Status {
  bool ok = true;
  std::string error;
};
using Handler = std::function<void(const Status&)>;

// One underlying MTLCommandBuffer: the unit a queue executes.
class Root {
 public:
  Root(Queue* queue, uint64_t id);
  uint64_t id() const {
    return id_;
  }
  RootState state() const;
  Queue* queue() const {
    return queue_;
  }

 private:
  friend class CommandBuffer;
  friend class Queue;
  friend class Device;
  struct Command {
    enum Kind { kKernel, kSignal, kWait } kind;
    Kernel kernel;
    SharedEventPtr event;
    uint64_t value = 0;
  };
  Queue* queue_;
  const uint64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  RootState state_ = RootState::kOpen;
  std::vector<Command> commands_;
  // Every buffer encoded here; each holds a +1 retain in retained mode.
  std::vector<BufferPtr> used_;
  std::vector<Handler> completed_handlers_;
  Status status_;
};
using RootPtr = std::shared_ptr<Root>;

class CommandBuffer;

class ComputeEncoder {
 public:
  void dispatch(Kernel kernel);
  void endEncoding();
  bool ended() const {
    return ended_.load();
  }

 private:
  friend class CommandBuffer;
  explicit ComputeEncoder(CommandBuffer* cb) : cb_(cb) {}
  CommandBuffer* cb_;
  std::atomic<bool> ended_{false};
};
using EncoderPtr = std::shared_ptr<ComputeEncoder>;

// An MPSCommandBuffer: a wrapper whose root can be swapped by
// commitAndContinue().
class CommandBuffer : public std::enable_shared_from_this<CommandBuffer> {
 public:
  CommandBuffer(Queue* queue, RootPtr root);
  EncoderPtr computeEncoder();
  // Event commands go between passes; an open encoder is a violation.
  void encodeSignal(const SharedEventPtr& event, uint64_t value);
  void encodeWait(const SharedEventPtr& event, uint64_t value);
  void addCompletedHandler(Handler handler);
  void commit();
  // Commits the current root and continues on a fresh one.
  void commitAndContinue();
  // Waits for the current root; a violation (deadlock) if it is uncommitted.
  void waitUntilCompleted();
  RootPtr root() const;
  Queue* queue() const {
    return queue_;
  }

 private:
  friend class ComputeEncoder;
  // Detects two threads inside encoding calls of one buffer at once.
  class EncodeScope {
   public:
    explicit EncodeScope(CommandBuffer* cb);
    ~EncodeScope();

   private:
    CommandBuffer* cb_;
  };
  void encodeKernel(Kernel kernel);
  void requireOpen(const char* what) const;
  Queue* queue_;
  mutable std::mutex mu_;
  RootPtr root_;
  bool committed_ = false;
  EncoderPtr open_encoder_;
  std::atomic<std::thread::id> encoding_thread_{};
};
using CommandBufferPtr = std::shared_ptr<CommandBuffer>;

class Queue {
 public:
  Queue(Device* device, uint64_t id);
  ~Queue();
  uint64_t id() const {
    return id_;
  }
  Device* device() const {
    return device_;
  }
  // Blocks while max_inflight buffers of this queue are uncompleted.
  CommandBufferPtr makeCommandBuffer();
  // Holds execution: committed roots stay committed until resume().
  void pause();
  void resume();
  size_t uncompleted() const;
  // Committed and not yet executing: all committed work while paused.
  size_t pending() const;

 private:
  friend class CommandBuffer;
  friend class Device;
  RootPtr newRoot();
  void submit(RootPtr root);
  void run();
  void execute(Root& root);
  void retire();
  Device* device_;
  const uint64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RootPtr> fifo_;
  size_t uncompleted_ = 0; // created, not completed (the in-flight cap)
  size_t unretired_ = 0; // committed, completion handlers not yet run
  bool executing_ = false;
  bool paused_ = false;
  bool stop_ = false;
  std::thread gpu_;
};
using QueuePtr = std::shared_ptr<Queue>;

// Records the races the allocator and the dependency tracker must prevent.
class Hazards {
 public:
  // A buffer is being handed out for reuse on `queue` (nullptr: to the CPU);
  // it is a hazard if work on another queue that may touch it has not
  // completed.
  void checkHandout(const Buffer& buffer, const Queue* queue);
  size_t count() const;
  std::vector<std::string> reports() const;
  void clear();

 private:
  friend class Device;
  friend class Root;
  friend class CommandBuffer;
  friend class Queue;
  struct Use {
    uint64_t queue;
    uint64_t root;
    Access access;
  };
  void record(std::string what);
  void encoded(const Buffer& b, const Root& r, Access a);
  void retired(const Buffer& b, const Root& r);
  void beginExecute(const Buffer& b, const Root& r, Access a);
  void endExecute(const Buffer& b, const Root& r);
  mutable std::mutex mu_;
  std::map<uint64_t, std::vector<Use>> pending_; // encoded, not completed
  std::map<uint64_t, std::vector<Use>> executing_;
  std::vector<std::string> reports_;
};

class Device {
 public:
  explicit Device(Config config = {});
  // Waits for all queues to drain and all handlers to run; reports
  // outstanding resources as violations.
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // nullptr when a queue-creation fault is armed.
  QueuePtr newCommandQueue();
  BufferPtr newBuffer(
      size_t words,
      size_t bytes = 0,
      unsigned char* external = nullptr);
  SharedEventPtr newSharedEvent();

  // Fault injection; the fixture resets these.
  void failNextQueueCreations(int n);
  void failNextCommits(int n, std::string error);

  Hazards& hazards() {
    return hazards_;
  }
  void setViolationHandler(std::function<void(const std::string&)> handler);
  void violation(const std::string& what);

  // Blocks until every committed root has completed and its handlers ran.
  void waitIdle();
  const Config& config() const {
    return config_;
  }
  uint64_t rootsCompleted() const {
    return roots_completed_.load();
  }

 private:
  friend class Queue;
  friend class SharedEvent;
  friend class Root;
  friend class CommandBuffer;
  std::chrono::microseconds drawLatency();
  void acquireGpu();
  void releaseGpu();
  bool takeCommitFault(std::string* error);
  void postCompletion(std::function<void()> fn);
  void postListener(std::function<void()> fn);
  void completionLoop();
  void listenerLoop();

  const Config config_;
  Hazards hazards_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  int queue_faults_ = 0;
  int commit_faults_ = 0;
  std::string commit_fault_error_;
  std::atomic<uint64_t> next_id_{1};
  // Counting semaphore for Config::gpu_parallelism.
  std::mutex gpu_mu_;
  std::condition_variable gpu_cv_;
  size_t gpu_busy_ = 0;
  std::atomic<uint64_t> roots_in_flight_{0};
  std::atomic<uint64_t> roots_completed_{0};
  std::function<void(const std::string&)> on_violation_;
  std::vector<std::weak_ptr<Queue>> queues_;

  // The completion and listener "dispatch queues".
  std::mutex dispatch_mu_;
  std::condition_variable dispatch_cv_;
  std::deque<std::function<void()>> completions_;
  std::deque<std::function<void()>> listener_jobs_;
  size_t dispatch_busy_ = 0;
  bool dispatch_stop_ = false;
  std::thread completion_thread_;
  std::thread listener_thread_;
};

} // namespace sim
