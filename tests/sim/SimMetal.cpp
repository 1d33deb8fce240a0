#include "SimMetal.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace sim {

// ---------------------------------------------------------------- Buffer

Buffer::Buffer(
    Device* device,
    uint64_t id,
    size_t words,
    size_t bytes,
    unsigned char* external)
    : device_(device),
      id_(id),
      words_(words),
      bytes_(bytes),
      data_(new std::atomic<int64_t>[words]),
      external_(external) {
  for (size_t i = 0; i < words; ++i) {
    data_[i].store(0, std::memory_order_relaxed);
  }
}

unsigned char* Buffer::contents() {
  if (external_ != nullptr) {
    return external_;
  }
  std::call_once(
      contents_once_, [this] { contents_.reset(new unsigned char[bytes_]()); });
  return contents_.get();
}

int64_t Buffer::read(size_t i) const {
  if (i >= words_) {
    device_->violation("buffer read out of bounds");
    return 0;
  }
  return data_[i].load(std::memory_order_acquire);
}

void Buffer::write(size_t i, int64_t v) {
  if (i >= words_) {
    device_->violation("buffer write out of bounds");
    return;
  }
  data_[i].store(v, std::memory_order_release);
}

// ---------------------------------------------------------------- SharedEvent

uint64_t SharedEvent::signaledValue() const {
  std::lock_guard<std::mutex> lock(mu_);
  return value_;
}

void SharedEvent::setSignaledValue(uint64_t value) {
  std::vector<std::function<void(uint64_t)>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (value <= value_) {
      return; // values only rise; smaller writes change nothing
    }
    value_ = value;
    auto end = listeners_.upper_bound(value_);
    for (auto it = listeners_.begin(); it != end; ++it) {
      ready.push_back(std::move(it->second));
    }
    listeners_.erase(listeners_.begin(), end);
  }
  cv_.notify_all();
  for (auto& fn : ready) {
    device_->postListener([fn = std::move(fn), value]() { fn(value); });
  }
}

void SharedEvent::notifyListener(
    uint64_t value,
    std::function<void(uint64_t)> fn) {
  uint64_t now = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (value_ < value) {
      listeners_.emplace(value, std::move(fn));
      return;
    }
    now = value_;
  }
  device_->postListener([fn = std::move(fn), now]() { fn(now); });
}

bool SharedEvent::waitFor(uint64_t value, std::chrono::milliseconds timeout)
    const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return value_ >= value; });
}

// ---------------------------------------------------------------- Root

Root::Root(Queue* queue, uint64_t id) : queue_(queue), id_(id) {}

RootState Root::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

// ---------------------------------------------------------------- Encoder

void ComputeEncoder::dispatch(Kernel kernel) {
  if (ended_.load()) {
    cb_->queue()->device()->violation("dispatch on an ended encoder");
    return;
  }
  cb_->encodeKernel(std::move(kernel));
}

void ComputeEncoder::endEncoding() {
  std::lock_guard<std::mutex> lock(cb_->mu_);
  if (ended_.exchange(true)) {
    cb_->queue()->device()->violation("endEncoding called twice");
    return;
  }
  if (cb_->open_encoder_.get() == this) {
    cb_->open_encoder_.reset();
  }
}

// ----------------------------------------------------------------
// CommandBuffer

CommandBuffer::CommandBuffer(Queue* queue, RootPtr root)
    : queue_(queue), root_(std::move(root)) {}

CommandBuffer::EncodeScope::EncodeScope(CommandBuffer* cb) : cb_(cb) {
  std::thread::id none{};
  const std::thread::id self = std::this_thread::get_id();
  if (!cb_->encoding_thread_.compare_exchange_strong(none, self) &&
      none != self) {
    cb_->queue_->device()->violation(
        "command buffer encoded from two threads at once");
  }
  if (cb_->queue_->device()->config().widen_encode_windows) {
    std::this_thread::yield();
  }
}

CommandBuffer::EncodeScope::~EncodeScope() {
  std::thread::id self = std::this_thread::get_id();
  cb_->encoding_thread_.compare_exchange_strong(self, std::thread::id{});
}

void CommandBuffer::requireOpen(const char* what) const {
  if (committed_) {
    queue_->device()->violation(std::string(what) + " after commit");
  }
}

EncoderPtr CommandBuffer::computeEncoder() {
  EncodeScope scope(this);
  std::lock_guard<std::mutex> lock(mu_);
  requireOpen("computeEncoder");
  if (open_encoder_) {
    queue_->device()->violation(
        "computeEncoder while another encoder is still open");
  }
  open_encoder_ = EncoderPtr(new ComputeEncoder(this));
  return open_encoder_;
}

void CommandBuffer::encodeKernel(Kernel kernel) {
  EncodeScope scope(this);
  std::lock_guard<std::mutex> lock(mu_);
  requireOpen("dispatch");
  Device* device = queue_->device();
  std::lock_guard<std::mutex> root_lock(root_->mu_);
  for (auto& [buffer, access] : kernel.uses) {
    device->hazards().encoded(*buffer, *root_, access);
    if (device->config().retained_references) {
      buffer->retain_count_.fetch_add(1, std::memory_order_acq_rel);
    }
    root_->used_.push_back(buffer);
  }
  Root::Command c{Root::Command::kKernel, std::move(kernel), nullptr, 0};
  root_->commands_.push_back(std::move(c));
}

void CommandBuffer::encodeSignal(const SharedEventPtr& event, uint64_t value) {
  EncodeScope scope(this);
  std::lock_guard<std::mutex> lock(mu_);
  requireOpen("encodeSignalEvent");
  if (open_encoder_) {
    queue_->device()->violation("encodeSignalEvent with an open encoder");
  }
  std::lock_guard<std::mutex> root_lock(root_->mu_);
  root_->commands_.push_back({Root::Command::kSignal, {}, event, value});
}

void CommandBuffer::encodeWait(const SharedEventPtr& event, uint64_t value) {
  EncodeScope scope(this);
  std::lock_guard<std::mutex> lock(mu_);
  requireOpen("encodeWaitForEvent");
  if (open_encoder_) {
    queue_->device()->violation("encodeWaitForEvent with an open encoder");
  }
  std::lock_guard<std::mutex> root_lock(root_->mu_);
  root_->commands_.push_back({Root::Command::kWait, {}, event, value});
}

void CommandBuffer::addCompletedHandler(Handler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  requireOpen("addCompletedHandler");
  std::lock_guard<std::mutex> root_lock(root_->mu_);
  root_->completed_handlers_.push_back(std::move(handler));
}

void CommandBuffer::commit() {
  RootPtr root;
  {
    EncodeScope scope(this);
    std::lock_guard<std::mutex> lock(mu_);
    if (committed_) {
      queue_->device()->violation("commit called twice");
      return;
    }
    if (open_encoder_) {
      queue_->device()->violation("commit with an open encoder");
    }
    committed_ = true;
    root = root_;
  }
  queue_->submit(std::move(root));
}

// The old root is submitted before the new one is made: making it may block
// at the in-flight cap, and the old root's work must not wait behind that.
void CommandBuffer::commitAndContinue() {
  EncodeScope scope(this);
  std::lock_guard<std::mutex> lock(mu_);
  requireOpen("commitAndContinue");
  if (open_encoder_) {
    queue_->device()->violation("commitAndContinue with an open encoder");
  }
  queue_->submit(root_);
  root_ = queue_->newRoot();
}

void CommandBuffer::waitUntilCompleted() {
  RootPtr root = this->root();
  std::unique_lock<std::mutex> lock(root->mu_);
  if (root->state_ == RootState::kOpen) {
    queue_->device()->violation(
        "waitUntilCompleted on an uncommitted root would never return");
    return;
  }
  root->cv_.wait(lock, [&] {
    return root->state_ == RootState::kCompleted ||
        root->state_ == RootState::kError;
  });
}

RootPtr CommandBuffer::root() const {
  std::lock_guard<std::mutex> lock(mu_);
  return root_;
}

// ---------------------------------------------------------------- Queue

Queue::Queue(Device* device, uint64_t id)
    : device_(device), id_(id), gpu_([this] { run(); }) {}

Queue::~Queue() {
  {
    // Completions still queued on the device's thread refer to this queue.
    std::unique_lock<std::mutex> lock(mu_);
    paused_ = false;
    cv_.notify_all();
    cv_.wait(lock, [&] { return unretired_ == 0; });
    stop_ = true;
  }
  cv_.notify_all();
  gpu_.join();
}

RootPtr Queue::newRoot() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return uncompleted_ < device_->config().max_inflight; });
  ++uncompleted_;
  device_->roots_in_flight_.fetch_add(1);
  return std::make_shared<Root>(this, device_->next_id_.fetch_add(1));
}

CommandBufferPtr Queue::makeCommandBuffer() {
  return std::make_shared<CommandBuffer>(this, newRoot());
}

void Queue::submit(RootPtr root) {
  {
    std::lock_guard<std::mutex> root_lock(root->mu_);
    root->state_ = RootState::kCommitted;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fifo_.push_back(std::move(root));
    ++unretired_;
  }
  cv_.notify_all();
}

void Queue::pause() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
}

void Queue::resume() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

size_t Queue::uncompleted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return uncompleted_;
}

size_t Queue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fifo_.size();
}

void Queue::run() {
  for (;;) {
    RootPtr root;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (!paused_ && !fifo_.empty()); });
      if (fifo_.empty()) {
        return; // stop_ with nothing left
      }
      root = fifo_.front();
      fifo_.pop_front();
      executing_ = true;
    }
    device_->acquireGpu();
    execute(*root);
    device_->releaseGpu();
    {
      std::lock_guard<std::mutex> lock(mu_);
      executing_ = false;
    }
    cv_.notify_all();
  }
}

void Queue::execute(Root& root) {
  const auto latency = device_->drawLatency();
  Status status;
  std::vector<Root::Command> commands;
  {
    std::lock_guard<std::mutex> lock(root.mu_);
    commands = std::move(root.commands_);
  }
  size_t kernels = 0;
  for (const auto& c : commands) {
    kernels += c.kind == Root::Command::kKernel;
  }
  for (auto& c : commands) {
    if (!status.ok) {
      break; // an error stops the rest of the buffer
    }
    switch (c.kind) {
      case Root::Command::kWait:
        if (!c.event->waitFor(c.value, device_->config().event_wait_timeout)) {
          status = {false, "timeout: event wait was never signaled"};
        }
        break;
      case Root::Command::kSignal:
        c.event->setSignaledValue(c.value);
        break;
      case Root::Command::kKernel: {
        for (auto& [b, a] : c.kernel.uses) {
          device_->hazards().beginExecute(*b, root, a);
        }
        if (latency.count() > 0) {
          std::this_thread::sleep_for(latency / (kernels ? kernels : 1));
        }
        if (c.kernel.body) {
          c.kernel.body();
        }
        for (auto& [b, a] : c.kernel.uses) {
          device_->hazards().endExecute(*b, root);
        }
        break;
      }
    }
  }
  if (kernels == 0 && latency.count() > 0) {
    std::this_thread::sleep_for(latency);
  }
  std::string fault;
  if (status.ok && device_->takeCommitFault(&fault)) {
    status = {false, fault};
  }

  std::vector<BufferPtr> used;
  std::vector<Handler> handlers;
  {
    std::lock_guard<std::mutex> lock(root.mu_);
    used = std::move(root.used_);
    handlers = std::move(root.completed_handlers_);
  }
  // GPU work is over: release the retains and the pending uses before the
  // buffer reports completion, as Metal does.
  for (auto& b : used) {
    device_->hazards().retired(*b, root);
    if (device_->config().retained_references) {
      b->retain_count_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  {
    std::lock_guard<std::mutex> lock(root.mu_);
    root.state_ = status.ok ? RootState::kCompleted : RootState::kError;
    root.status_ = status;
  }
  root.cv_.notify_all();
  device_->postCompletion([this, handlers = std::move(handlers), status]() {
    for (auto& h : handlers) {
      h(status);
    }
    retire();
  });
}

void Queue::retire() {
  device_->roots_in_flight_.fetch_sub(1);
  device_->roots_completed_.fetch_add(1);
  // Notify under the lock: once it is released the destructor may run.
  std::lock_guard<std::mutex> lock(mu_);
  --uncompleted_;
  --unretired_;
  cv_.notify_all();
}

// ---------------------------------------------------------------- Hazards

void Hazards::record(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  reports_.push_back(std::move(what));
}

void Hazards::encoded(const Buffer& b, const Root& r, Access a) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_[b.id()].push_back({r.queue()->id(), r.id(), a});
}

void Hazards::retired(const Buffer& b, const Root& r) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(b.id());
  if (it == pending_.end()) {
    return;
  }
  auto& uses = it->second;
  for (size_t i = 0; i < uses.size();) {
    if (uses[i].root == r.id()) {
      uses[i] = uses.back();
      uses.pop_back();
    } else {
      ++i;
    }
  }
  if (uses.empty()) {
    pending_.erase(it);
  }
}

void Hazards::checkHandout(const Buffer& buffer, const Queue* queue) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(buffer.id());
  if (it == pending_.end()) {
    return;
  }
  for (const Use& u : it->second) {
    if (queue == nullptr || u.queue != queue->id()) {
      std::ostringstream ss;
      ss << "buffer " << buffer.id() << " handed out to "
         << (queue ? "queue " + std::to_string(queue->id()) : "the CPU")
         << " while command buffer " << u.root << " on queue " << u.queue
         << " may still " << (u.access == Access::kWrite ? "write" : "read")
         << " it";
      reports_.push_back(ss.str());
      return;
    }
  }
}

void Hazards::beginExecute(const Buffer& b, const Root& r, Access a) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& running = executing_[b.id()];
  for (const Use& u : running) {
    if (u.queue != r.queue()->id() &&
        (u.access == Access::kWrite || a == Access::kWrite)) {
      std::ostringstream ss;
      ss << "buffer " << b.id() << ": queues " << u.queue << " and "
         << r.queue()->id() << " access it at the same time ("
         << (u.access == Access::kWrite ? "write" : "read") << "/"
         << (a == Access::kWrite ? "write" : "read") << ")";
      reports_.push_back(ss.str());
    }
  }
  running.push_back({r.queue()->id(), r.id(), a});
}

void Hazards::endExecute(const Buffer& b, const Root& r) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& running = executing_[b.id()];
  for (size_t i = 0; i < running.size(); ++i) {
    if (running[i].root == r.id()) {
      running[i] = running.back();
      running.pop_back();
      break;
    }
  }
  if (running.empty()) {
    executing_.erase(b.id());
  }
}

size_t Hazards::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_.size();
}

std::vector<std::string> Hazards::reports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_;
}

void Hazards::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  reports_.clear();
}

// ---------------------------------------------------------------- Device

Device::Device(Config config)
    : config_(config),
      rng_(config.seed),
      completion_thread_([this] { completionLoop(); }),
      listener_thread_([this] { listenerLoop(); }) {}

Device::~Device() {
  waitIdle();
  {
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    dispatch_stop_ = true;
  }
  dispatch_cv_.notify_all();
  completion_thread_.join();
  listener_thread_.join();
  if (roots_in_flight_.load() != 0) {
    violation(
        "device destroyed with " + std::to_string(roots_in_flight_.load()) +
        " command buffers not completed (an uncommitted buffer was leaked)");
  }
}

QueuePtr Device::newCommandQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_faults_ > 0) {
      --queue_faults_;
      return nullptr;
    }
  }
  auto q = std::make_shared<Queue>(this, next_id_.fetch_add(1));
  std::lock_guard<std::mutex> lock(mu_);
  queues_.push_back(q);
  return q;
}

BufferPtr Device::newBuffer(
    size_t words,
    size_t bytes,
    unsigned char* external) {
  return std::make_shared<Buffer>(
      this, next_id_.fetch_add(1), words, bytes, external);
}

SharedEventPtr Device::newSharedEvent() {
  return std::make_shared<SharedEvent>(this);
}

void Device::failNextQueueCreations(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_faults_ = n;
}

void Device::failNextCommits(int n, std::string error) {
  std::lock_guard<std::mutex> lock(mu_);
  commit_faults_ = n;
  commit_fault_error_ = std::move(error);
}

bool Device::takeCommitFault(std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (commit_faults_ == 0) {
    return false;
  }
  --commit_faults_;
  *error = commit_fault_error_;
  return true;
}

std::chrono::microseconds Device::drawLatency() {
  if (config_.max_latency <= config_.min_latency) {
    return config_.min_latency;
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::uniform_int_distribution<int64_t> d(
      config_.min_latency.count(), config_.max_latency.count());
  return std::chrono::microseconds(d(rng_));
}

void Device::acquireGpu() {
  if (config_.gpu_parallelism == 0) {
    return;
  }
  std::unique_lock<std::mutex> lock(gpu_mu_);
  gpu_cv_.wait(lock, [&] { return gpu_busy_ < config_.gpu_parallelism; });
  ++gpu_busy_;
}

void Device::releaseGpu() {
  if (config_.gpu_parallelism == 0) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(gpu_mu_);
    --gpu_busy_;
  }
  gpu_cv_.notify_one();
}

void Device::setViolationHandler(
    std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  on_violation_ = std::move(handler);
}

void Device::violation(const std::string& what) {
  std::function<void(const std::string&)> handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handler = on_violation_;
  }
  if (handler) {
    handler(what);
    return;
  }
  std::fprintf(stderr, "simulated Metal: %s\n", what.c_str());
  std::abort();
}

void Device::postCompletion(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    completions_.push_back(std::move(fn));
    if (config_.reorder_completions > 0 && completions_.size() >= 2) {
      std::lock_guard<std::mutex> rng_lock(mu_);
      if (std::uniform_real_distribution<double>(0, 1)(rng_) <
          config_.reorder_completions) {
        std::swap(
            completions_[completions_.size() - 1],
            completions_[completions_.size() - 2]);
      }
    }
  }
  dispatch_cv_.notify_all();
}

void Device::postListener(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    listener_jobs_.push_back(std::move(fn));
  }
  dispatch_cv_.notify_all();
}

void Device::completionLoop() {
  std::unique_lock<std::mutex> lock(dispatch_mu_);
  for (;;) {
    dispatch_cv_.wait(
        lock, [&] { return dispatch_stop_ || !completions_.empty(); });
    if (completions_.empty()) {
      return;
    }
    auto fn = std::move(completions_.front());
    completions_.pop_front();
    ++dispatch_busy_;
    lock.unlock();
    fn();
    lock.lock();
    --dispatch_busy_;
    dispatch_cv_.notify_all();
  }
}

void Device::listenerLoop() {
  std::unique_lock<std::mutex> lock(dispatch_mu_);
  for (;;) {
    dispatch_cv_.wait(
        lock, [&] { return dispatch_stop_ || !listener_jobs_.empty(); });
    if (listener_jobs_.empty()) {
      return;
    }
    auto fn = std::move(listener_jobs_.front());
    listener_jobs_.pop_front();
    ++dispatch_busy_;
    lock.unlock();
    fn();
    lock.lock();
    --dispatch_busy_;
    dispatch_cv_.notify_all();
  }
}

void Device::waitIdle() {
  // Roots still open are the caller's; committed ones drain by themselves.
  std::vector<QueuePtr> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : queues_) {
      if (auto q = w.lock()) {
        live.push_back(std::move(q));
      }
    }
  }
  for (auto& q : live) {
    std::unique_lock<std::mutex> lock(q->mu_);
    q->cv_.wait(lock, [&] {
      return q->paused_ || (q->fifo_.empty() && !q->executing_);
    });
  }
  std::unique_lock<std::mutex> lock(dispatch_mu_);
  dispatch_cv_.wait(lock, [&] {
    return completions_.empty() && listener_jobs_.empty() &&
        dispatch_busy_ == 0;
  });
}

} // namespace sim
