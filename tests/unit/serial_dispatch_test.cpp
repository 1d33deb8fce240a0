// Synchronous dispatch onto a stream's serial queue: exceptions reach the
// caller, re-entry runs inline instead of deadlocking, and concurrent callers
// are serialised. Both ways libdispatch may run a dispatch_sync block are
// modelled: on the calling thread, and on the queue's own thread.

#include "harness.h"

#include <ATen/mps/MPSSerialDispatch.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using at::mps::dispatchSyncWithRethrow;
using at::mps::SerialSection;

// Runs dispatch_sync blocks on the calling thread under the queue's lock.
// A dispatch from inside one of its own blocks deadlocks in libdispatch; here
// it is counted and skipped, so a broken re-entry check fails the test
// instead of hanging it.
class CallerThreadQueue {
 public:
  void dispatchSync(void* ctx, void (*work)(void*)) {
    ++dispatches;
    if (owner_.load() == std::this_thread::get_id()) {
      ++deadlocks;
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    owner_ = std::this_thread::get_id();
    work(ctx);
    owner_ = std::thread::id();
  }
  std::atomic<int> dispatches{0};
  std::atomic<int> deadlocks{0};

 private:
  std::mutex mu_;
  std::atomic<std::thread::id> owner_{};
};

// Runs dispatch_sync blocks on the queue's own thread, one at a time.
class WorkerThreadQueue {
 public:
  WorkerThreadQueue() : worker_([this] { run(); }) {}
  ~WorkerThreadQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void dispatchSync(void* ctx, void (*work)(void*)) {
    ++dispatches;
    if (std::this_thread::get_id() == worker_.get_id()) {
      ++deadlocks;
      return;
    }
    std::promise<void> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back([&] {
        work(ctx);
        done.set_value();
      });
    }
    cv_.notify_all();
    done.get_future().wait();
  }
  std::thread::id threadId() const {
    return worker_.get_id();
  }
  std::atomic<int> dispatches{0};
  std::atomic<int> deadlocks{0};

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) {
          return;
        }
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread worker_; // last: starts after the members it uses
};

template <typename Queue, typename Fn>
void onQueue(Queue& q, Fn&& fn) {
  dispatchSyncWithRethrow(
      &q,
      [&q](void* ctx, void (*work)(void*)) { q.dispatchSync(ctx, work); },
      std::forward<Fn>(fn));
}

struct ShapeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename Queue>
class SerialDispatchTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_EQ(a_.deadlocks.load(), 0);
    EXPECT_EQ(b_.deadlocks.load(), 0);
  }
  Queue a_;
  Queue b_;
};

using QueueKinds = ::testing::Types<CallerThreadQueue, WorkerThreadQueue>;
TYPED_TEST_SUITE(SerialDispatchTest, QueueKinds);

TYPED_TEST(SerialDispatchTest, RunsTheBlockInsideTheQueuesSection) {
  auto& q = this->a_;
  bool inside = false;
  onQueue(q, [&] { inside = SerialSection::isActive(&q); });
  EXPECT_TRUE(inside);
  EXPECT_FALSE(SerialSection::isActive(&q));
  EXPECT_EQ(q.dispatches.load(), 1);
}

TYPED_TEST(SerialDispatchTest, ReentryRunsInlineInsteadOfDeadlocking) {
  auto& q = this->a_;
  int depth = 0;
  onQueue(q, [&] {
    ++depth;
    onQueue(q, [&] {
      ++depth;
      onQueue(q, [&] { ++depth; });
    });
  });
  EXPECT_EQ(depth, 3);
  EXPECT_EQ(q.dispatches.load(), 1);
}

TYPED_TEST(SerialDispatchTest, NestedSectionsOfTwoQueuesReenterEitherInline) {
  auto& a = this->a_;
  auto& b = this->b_;
  int reached = 0;
  onQueue(a, [&] {
    onQueue(b, [&] { // a different queue: a real dispatch
      onQueue(a, [&] { // back onto a: inline
        onQueue(b, [&] { ++reached; }); // and b: inline
      });
    });
  });
  EXPECT_EQ(reached, 1);
  EXPECT_EQ(a.dispatches.load(), 1);
  EXPECT_EQ(b.dispatches.load(), 1);
}

TYPED_TEST(SerialDispatchTest, PropagatesTheBlocksExceptionToTheCaller) {
  auto& q = this->a_;
  EXPECT_TORCH_ERROR(
      onQueue(
          q,
          [] { TORCH_CHECK(false, "linear(): shapes cannot be multiplied"); }),
      "linear(): shapes cannot be multiplied");
  EXPECT_THROW(onQueue(q, [] { throw ShapeError("bad"); }), ShapeError);
  // The queue still works, and the section ended with the failed block.
  int ran = 0;
  onQueue(q, [&] { ++ran; });
  EXPECT_EQ(ran, 1);
  EXPECT_FALSE(SerialSection::isActive(&q));
}

TYPED_TEST(SerialDispatchTest, PropagatesAnExceptionThrownInsideAReentry) {
  auto& q = this->a_;
  EXPECT_TORCH_ERROR(
      onQueue(
          q, [&] { onQueue(q, [] { TORCH_CHECK(false, "inner failure"); }); }),
      "inner failure");
  EXPECT_EQ(q.dispatches.load(), 1);
}

TYPED_TEST(SerialDispatchTest, ConcurrentCallersAreSerialised) {
  auto& q = this->a_;
  constexpr int kThreads = 8;
  const int kIterations = 500 * harness::stressScale();
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  int counter = 0; // guarded only by the queue's serialisation
  harness::Latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      start.arriveAndWait();
      for (int i = 0; i < kIterations; ++i) {
        onQueue(q, [&] {
          if (inside.fetch_add(1) != 0) {
            overlaps.fetch_add(1);
          }
          ++counter;
          inside.fetch_sub(1);
        });
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(counter, kThreads * kIterations);
}

TEST(SerialDispatchWorkerTest, SectionIsMarkedOnTheThreadThatRunsTheBlock) {
  WorkerThreadQueue q;
  std::thread::id ran_on;
  onQueue(q, [&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, q.threadId());
  EXPECT_NE(ran_on, std::this_thread::get_id());
  // After a failing block, the queue's thread is no longer in the section.
  EXPECT_THROW(onQueue(q, [] { throw ShapeError("x"); }), ShapeError);
  bool still_marked = true;
  struct Probe {
    WorkerThreadQueue* q;
    bool* marked;
  } probe{&q, &still_marked};
  q.dispatchSync(&probe, [](void* ctx) {
    auto* p = static_cast<Probe*>(ctx);
    *p->marked = SerialSection::isActive(p->q);
  });
  EXPECT_FALSE(still_marked);
}

} // namespace
