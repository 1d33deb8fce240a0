// Test-only libdispatch for the glue build on Linux, where Debian has none:
// the serial-queue part of the API that the glue uses, as declared by the
// stand-in tests/compile/sdk/dispatch/dispatch.h, with libdispatch's
// semantics:
//  - a queue runs one work item at a time, in the order of submission;
//  - dispatch_sync runs its item on the calling thread once every item
//    submitted before it has run and the queue is free; dispatch_async items
//    run on the queue's worker thread, each in its own autorelease pool;
//  - dispatch_get_specific answers for the queue whose item the calling
//    thread is running: the innermost one of nested dispatch_sync calls;
//  - dispatch_sync onto a queue whose item the calling thread is running
//    deadlocks in libdispatch; here it aborts with libdispatch's message;
//  - an exception may not leave a work item (it cannot unwind through
//    libdispatch): std::terminate, via noexcept.
//  - dispatch_release drops a reference; a queue goes when the last one
//    does. A queue's worker thread holds a reference while it runs and
//    exits once no dispatch_async item is left, as libdispatch lends its
//    pool threads to queues with work.

#include "SimObjC.h"

#include <ATen/mps/MPSThreadAnnotations.h>
#include <dispatch/dispatch.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>
#include <thread>

namespace {

using at::mps::CondVar;
using at::mps::Mutex;
using at::mps::MutexLock;

struct WorkItem {
  dispatch_function_t work;
  void* context;
  uint64_t ticket;
  bool sync;
};

struct QueueState {
  std::string label;
  Mutex mu;
  CondVar changed;
  std::deque<WorkItem> fifo MPS_GUARDED_BY(mu);
  bool busy MPS_GUARDED_BY(mu) = false; // an item is running
  bool has_worker MPS_GUARDED_BY(mu) = false;
  size_t async_items MPS_GUARDED_BY(mu) = 0; // in fifo
  uint64_t next_ticket MPS_GUARDED_BY(mu) = 0;
  std::map<const void*, void*> specifics MPS_GUARDED_BY(mu);
};

// The queues whose items the calling thread is running: a chain through
// run()'s frames, innermost first. A trivially destructible thread_local, so
// that static destructors that dispatch after the main thread's
// thread_locals are gone (MPSProfiler's) still find it.
struct Running {
  QueueState* queue;
  const Running* outer;
};
thread_local const Running* tls_running = nullptr;

bool isRunning(const QueueState* queue) {
  for (const Running* r = tls_running; r != nullptr; r = r->outer) {
    if (r->queue == queue) {
      return true;
    }
  }
  return false;
}

[[noreturn]] void crash(const char* what, const QueueState& queue) {
  std::fprintf(stderr, "BUG IN CLIENT OF LIBDISPATCH: %s (queue '%s')\n", what, queue.label.c_str());
  std::abort();
}

void run(QueueState* queue, const WorkItem& item) noexcept {
  const Running running{queue, tls_running};
  tls_running = &running;
  item.work(item.context);
  tls_running = running.outer;
}

void finish(QueueState* queue) {
  {
    MutexLock lock(queue->mu);
    queue->busy = false;
  }
  queue->changed.notifyAll();
}

// Runs `object`'s dispatch_async items until none is left, then drops the
// reference that enqueueAsync() took for it.
void workerLoop(id object, QueueState* queue) {
  for (;;) {
    WorkItem item;
    {
      MutexLock lock(queue->mu);
      queue->changed.wait(queue->mu, [queue]() MPS_REQUIRES(queue->mu) {
        return queue->async_items == 0 || (!queue->busy && !queue->fifo.front().sync);
      });
      if (queue->async_items == 0) {
        queue->has_worker = false;
        break;
      }
      item = queue->fifo.front();
      queue->fifo.pop_front();
      --queue->async_items;
      queue->busy = true;
    }
    @autoreleasepool {
      run(queue, item);
    }
    finish(queue);
  }
  [object release];
}

void enqueueAsync(id object, QueueState* queue, void* context, dispatch_function_t work) {
  {
    MutexLock lock(queue->mu);
    queue->fifo.push_back({work, context, queue->next_ticket++, false});
    ++queue->async_items;
    if (!queue->has_worker) {
      queue->has_worker = true;
      [object retain];
      std::thread([object, queue] { workerLoop(object, queue); }).detach();
    }
  }
  queue->changed.notifyAll();
}

void callBlock(void* block) {
  auto b = (dispatch_block_t)block;
  b();
}

void callAndReleaseBlock(void* block) {
  callBlock(block);
  _Block_release(block);
}

} // namespace

@interface SimDispatchQueue : NSObject<OS_dispatch_queue>
@end

@implementation SimDispatchQueue
SIM_OBJC_STATE(QueueState)
SIM_OBJC_RETAIN_COUNT(QueueState)
@end

namespace {
QueueState* stateOf(dispatch_queue_t queue) {
  return &sim::objc::state<QueueState>(queue);
}
} // namespace

extern "C" {

dispatch_queue_t dispatch_queue_create(const char* label, dispatch_queue_attr_t attr) {
  SimDispatchQueue* queue = [[SimDispatchQueue alloc] init];
  QueueState* state = stateOf(queue);
  state->label = label ? label : "";
  if (attr != DISPATCH_QUEUE_SERIAL) {
    crash("only serial queues are simulated", *state);
  }
  return queue;
}

void dispatch_queue_set_specific(dispatch_queue_t queue,
                                 const void* key,
                                 void* context,
                                 dispatch_function_t destructor) {
  QueueState* state = stateOf(queue);
  if (destructor != nullptr) {
    // it would run when the queue is destroyed, which never happens here
    crash("dispatch_queue_set_specific with a destructor is not simulated", *state);
  }
  MutexLock lock(state->mu);
  state->specifics[key] = context;
}

void* dispatch_get_specific(const void* key) {
  if (tls_running == nullptr) {
    return nullptr;
  }
  QueueState* state = tls_running->queue;
  MutexLock lock(state->mu);
  auto it = state->specifics.find(key);
  return it == state->specifics.end() ? nullptr : it->second;
}

void dispatch_sync_f(dispatch_queue_t queue, void* context, dispatch_function_t work) {
  QueueState* state = stateOf(queue);
  if (isRunning(state)) {
    crash("dispatch_sync called on queue already owned by current thread", *state);
  }
  WorkItem item{work, context, 0, true};
  {
    MutexLock lock(state->mu);
    item.ticket = state->next_ticket++;
    state->fifo.push_back(item);
    state->changed.wait(
        state->mu, [&]() MPS_REQUIRES(state->mu) { return !state->busy && state->fifo.front().ticket == item.ticket; });
    state->fifo.pop_front();
    state->busy = true;
  }
  run(state, item);
  finish(state);
}

void dispatch_sync(dispatch_queue_t queue, dispatch_block_t block) {
  dispatch_sync_f(queue, (void*)block, callBlock);
}

void dispatch_async(dispatch_queue_t queue, dispatch_block_t block) {
  enqueueAsync(queue, stateOf(queue), (void*)_Block_copy((const void*)block), callAndReleaseBlock);
}

void dispatch_release(dispatch_object_t object) {
  [object release];
}

} // extern "C"
