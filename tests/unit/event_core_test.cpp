// Event bookkeeping: events act on the stream they are given, never rewind,
// and survive concurrent acquire/release/record/query/wait.

#include "SimEvents.h"
#include "event_peer.h"
#include "harness.h"

#include <atomic>
#include <thread>

namespace {

using at::mps::SyncType;
using ::testing::HasSubstr;

class EventCoreTest : public harness::SimTest {
 protected:
  EventCoreTest() : harness::SimTest(latency()) {}
  static sim::Config latency() {
    sim::Config c;
    c.min_latency = std::chrono::microseconds(200);
    c.max_latency = std::chrono::microseconds(600);
    c.event_wait_timeout = std::chrono::milliseconds(3000);
    return c;
  }
  void SetUp() override {
    harness::SimTest::SetUp();
    backend_ = std::make_unique<sim::SimEventBackend>(device());
    events_ = std::make_unique<sim::SimEventPool>(backend_.get());
    for (int i = 0; i < 3; ++i) {
      streams_.push_back(std::make_unique<sim::SimStream>(
          device().newCommandQueue(), i, false));
    }
  }
  void releaseResources() override {
    for (auto& s : streams_) {
      s->synchronize(SyncType::COMMIT_AND_WAIT);
    }
    device().waitIdle(); // pending notifications still hold event state
    events_.reset();
    streams_.clear();
  }
  sim::SimStream& stream(int i) {
    return *streams_[i];
  }
  static sim::Kernel write(const sim::BufferPtr& b, int64_t v) {
    return {{{b, sim::Access::kWrite}}, [b, v] { b->write(0, v); }};
  }

  std::unique_ptr<sim::SimEventBackend> backend_;
  std::unique_ptr<sim::SimEventPool> events_;
  std::vector<std::unique_ptr<sim::SimStream>> streams_;
};

TEST_F(EventCoreTest, RecordsOnTheGivenStream) {
  auto ev = events_->get(events_->acquire(false));
  stream(1).queue().pause();
  ev->record(stream(1), /*commit=*/true);
  EXPECT_FALSE(ev->query()); // stream 1 holds it back, stream 0 is idle
  stream(1).queue().resume();
  ev->synchronize();
  EXPECT_TRUE(ev->query());
}

TEST_F(EventCoreTest, CrossStreamWaitOrdersWorkOnTheGpuWithoutBlockingTheCpu) {
  auto buf = device().newBuffer(1);
  auto ev = events_->get(events_->acquire(false));
  std::atomic<int64_t> seen{-1};
  stream(0).queue().pause(); // a CPU-side wait would now never return
  stream(0).encodeKernel(write(buf, 42), SyncType::NONE);
  ev->record(stream(0), /*commit=*/true);
  EXPECT_TRUE(ev->wait(stream(1), /*commit=*/false));
  stream(1).synchronize(SyncType::COMMIT);
  EXPECT_EQ(seen.load(), -1); // stream 1 is held back on the GPU
  stream(0).queue().resume();
  stream(1).encodeKernel(
      {{{buf, sim::Access::kRead}}, [&] { seen = buf->read(0); }},
      SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(seen.load(), 42);
}

TEST_F(EventCoreTest, WaitCommitsARecordLeftInAnOpenBuffer) {
  auto ev = events_->get(events_->acquire(false));
  ev->record(stream(0), /*commit=*/false);
  ASSERT_TRUE(ev->wait(stream(1), /*commit=*/false));
  // Without the producer's commit this would time out into an error.
  stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_TRUE(ev->query());
}

TEST_F(EventCoreTest, UnrecordedEventHasNothingToWaitFor) {
  auto ev = events_->get(events_->acquire(false));
  EXPECT_FALSE(ev->query());
  EXPECT_FALSE(ev->wait(stream(0), true));
  ev->synchronize(); // returns at once
}

TEST_F(EventCoreTest, ReusedEventNeverRewindsItsValue) {
  const uint64_t first = events_->acquire(false);
  auto ev = events_->get(first);
  ev->record(stream(0), true);
  ev->synchronize();
  ASSERT_EQ(backend_->made().size(), 1u);
  const sim::SharedEventPtr handle = backend_->made()[0];
  const uint64_t signaled = handle->signaledValue();
  ASSERT_GT(signaled, 0u);
  sim::SimEvent* raw = ev.get();
  ev.reset();
  events_->release(first);

  const uint64_t second = events_->acquire(false);
  EXPECT_NE(second, first);
  auto again = events_->get(second);
  EXPECT_EQ(again.get(), raw); // the same object, reused
  EXPECT_EQ(at::mps::StreamEventTestPeer::id(*again), second);
  EXPECT_FALSE(again->query()); // not recorded by its new owner
  stream(2).queue().pause();
  again->record(stream(2), true);
  EXPECT_FALSE(again->query()); // a rewound value would read as signalled
  EXPECT_TRUE(again->wait(stream(1), true));
  stream(2).queue().resume();
  again->synchronize();
  EXPECT_GT(handle->signaledValue(), signaled);
}

TEST_F(EventCoreTest, MetalIgnoresTheRewindThatV291Wrote) {
  auto ev = device().newSharedEvent();
  ev->setSignaledValue(3);
  ev->setSignaledValue(0); // MPSEvent::reset in v2.9.1
  EXPECT_EQ(ev->signaledValue(), 3u);
}

// Timestamps are taken when an event's listener notification runs, as in
// v2.9.1, and Metal does not bound when that is: a start notification that
// runs late shortens the measured time. So the kernel is encoded only once
// start's time is taken; end's is taken after the kernel completed.
TEST_F(EventCoreTest, ElapsedTimeCoversTheWorkBetweenRecords) {
  auto start = events_->get(events_->acquire(true));
  auto end = events_->get(events_->acquire(true));
  auto buf = device().newBuffer(1);
  start->record(stream(0), true);
  start->synchronize();
  ASSERT_GT(start->completionTimeNs(), 0u);
  stream(0).encodeKernel(
      {{{buf, sim::Access::kWrite}},
       [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }},
      SyncType::COMMIT);
  end->record(stream(0), true);
  const double ms = end->elapsedMsSince(*start);
  EXPECT_GE(ms, 20.0 * 0.9); // the 20 ms kernel ran between the two
  auto untimed = events_->get(events_->acquire(false));
  untimed->record(stream(0), true);
  EXPECT_TORCH_ERROR(untimed->elapsedMsSince(*start), "enable_timing=True");
  auto never = events_->get(events_->acquire(true));
  EXPECT_TORCH_ERROR(
      never->elapsedMsSince(*start), "Both events must be recorded");
}

TEST_F(EventCoreTest, NotificationAfterReleaseTouchesNoReleasedEvent) {
  const uint64_t id = events_->acquire(true);
  {
    auto ev = events_->get(id);
    stream(0).queue().pause();
    ev->record(stream(0), true); // timing notification still pending
  }
  events_->release(id);
  events_->emptyCache();
  EXPECT_EQ(backend_->released(), 1u) << "the event object is destroyed";
  stream(0).queue().resume(); // the notification fires now (ASan checks)
  stream(0).synchronize(SyncType::COMMIT_AND_WAIT);
  device().waitIdle();
}

TEST_F(EventCoreTest, InvalidIdsRaiseErrorsNamingThem) {
  EXPECT_TORCH_ERROR(events_->get(12345), "event_id=12345");
  EXPECT_TORCH_ERROR(events_->release(777), "event_id=777");
}

TEST_F(EventCoreTest, ConcurrentAcquireRecordWaitQueryRelease) {
  constexpr int kThreads = 12;
  const int iters = 60 * harness::stressScale();
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto& mine = stream(t % 3);
      auto& other = stream((t + 1) % 3);
      for (int i = 0; i < iters; ++i) {
        const uint64_t id = events_->acquire(i % 2 == 0);
        try {
          auto ev = events_->get(id);
          ev->record(mine, i % 3 != 0);
          ev->query();
          ev->wait(other, true);
          if (i % 4 == 0) {
            ev->synchronize();
            if (!ev->query()) {
              errors++;
            }
          }
        } catch (const c10::Error&) {
          errors++;
        }
        events_->release(id);
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_EQ(errors.load(), 0);
  events_->emptyCache(); // destroys the events back in the pool: all of them
  EXPECT_EQ(backend_->released(), backend_->made().size());
}

} // namespace
