// Tests of the simulated Metal runtime itself: the fake must honour the
// contract in shared/METAL-SEMANTICS.md before it can prove anything else.

#include "harness.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>

namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class SimMetalTest : public harness::SimTest {
 protected:
  sim::Kernel write(const sim::BufferPtr& b, int64_t v) {
    return {{{b, sim::Access::kWrite}}, [b, v] { b->write(0, v); }};
  }
};

TEST_F(SimMetalTest, RejectsSecondCommit) {
  auto q = device().newCommandQueue();
  auto cb = q->makeCommandBuffer();
  cb->commit();
  cb->commit();
  device().waitIdle();
  EXPECT_THAT(takeViolations(), ElementsAre(HasSubstr("commit called twice")));
}

TEST_F(SimMetalTest, RejectsEncodingAndHandlersAfterCommit) {
  auto q = device().newCommandQueue();
  auto buf = device().newBuffer(1);
  auto cb = q->makeCommandBuffer();
  cb->commit();
  cb->computeEncoder();
  cb->addCompletedHandler([](const sim::Status&) {});
  device().waitIdle();
  EXPECT_THAT(
      takeViolations(),
      ElementsAre(
          HasSubstr("computeEncoder after commit"),
          HasSubstr("addCompletedHandler after commit")));
}

TEST_F(SimMetalTest, RejectsCommitWithOpenEncoderAndTwoOpenEncoders) {
  auto q = device().newCommandQueue();
  auto cb = q->makeCommandBuffer();
  auto enc = cb->computeEncoder();
  cb->computeEncoder();
  cb->commit();
  device().waitIdle();
  EXPECT_THAT(
      takeViolations(),
      ElementsAre(
          HasSubstr("another encoder is still open"),
          HasSubstr("commit with an open encoder")));
}

TEST_F(SimMetalTest, RejectsEventCommandsWithOpenEncoder) {
  auto q = device().newCommandQueue();
  auto ev = device().newSharedEvent();
  auto cb = q->makeCommandBuffer();
  auto enc = cb->computeEncoder();
  cb->encodeSignal(ev, 1);
  enc->endEncoding();
  cb->commit();
  device().waitIdle();
  EXPECT_THAT(
      takeViolations(), ElementsAre(HasSubstr("encodeSignalEvent with")));
}

TEST_F(SimMetalTest, DetectsEncodingFromTwoThreadsAtOnce) {
  config_.widen_encode_windows = true;
  SetUp();
  auto q = device().newCommandQueue();
  auto buf = device().newBuffer(1);
  auto cb = q->makeCommandBuffer();
  auto enc = cb->computeEncoder();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        enc->dispatch({{{buf, sim::Access::kRead}}, nullptr});
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  enc->endEncoding();
  cb->commit();
  device().waitIdle();
  EXPECT_THAT(takeViolations(), Contains(HasSubstr("two threads at once")));
}

TEST_F(SimMetalTest, WaitingOnRootLeftOpenByCommitAndContinueIsADeadlock) {
  auto q = device().newCommandQueue();
  auto cb = q->makeCommandBuffer();
  cb->commitAndContinue();
  cb->waitUntilCompleted();
  cb->commit();
  device().waitIdle();
  EXPECT_THAT(
      takeViolations(), ElementsAre(HasSubstr("uncommitted root would never")));
}

TEST_F(SimMetalTest, QueueRunsBuffersInCommitOrderAsynchronously) {
  config_.min_latency = std::chrono::microseconds(50);
  config_.max_latency = std::chrono::microseconds(300);
  SetUp();
  auto q = device().newCommandQueue();
  std::mutex mu;
  std::vector<int> order;
  std::vector<sim::CommandBufferPtr> cbs;
  for (int i = 0; i < 20; ++i) {
    auto cb = q->makeCommandBuffer();
    auto enc = cb->computeEncoder();
    enc->dispatch({{}, [&, i] {
                     std::lock_guard<std::mutex> lock(mu);
                     order.push_back(i);
                   }});
    enc->endEncoding();
    cb->commit();
    cbs.push_back(cb);
  }
  for (auto& cb : cbs) {
    cb->waitUntilCompleted();
  }
  std::vector<int> expected(20);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST_F(SimMetalTest, ByteContentsAreZeroedAndWrittenByGpuWork) {
  auto q = device().newCommandQueue();
  auto buf = device().newBuffer(0, 16);
  ASSERT_EQ(buf->bytes(), 16u);
  EXPECT_EQ(buf->contents()[15], 0);
  auto cb = q->makeCommandBuffer();
  auto enc = cb->computeEncoder();
  enc->dispatch({{{buf, sim::Access::kWrite}}, [buf] {
                   std::fill_n(buf->contents(), buf->bytes(), 7);
                 }});
  enc->endEncoding();
  cb->commit();
  cb->waitUntilCompleted();
  EXPECT_EQ(buf->contents()[0], 7);
  EXPECT_EQ(buf->contents()[15], 7);
}

TEST_F(SimMetalTest, CompletedHandlersRunOnAnotherThreadAfterWorkAndOnError) {
  auto q = device().newCommandQueue();
  auto buf = device().newBuffer(1);
  std::atomic<int64_t> seen{-1};
  std::atomic<bool> ok{true};
  std::thread::id handler_thread;
  device().failNextCommits(1, "pageFault");
  auto cb = q->makeCommandBuffer();
  auto enc = cb->computeEncoder();
  enc->dispatch(write(buf, 42));
  enc->endEncoding();
  cb->addCompletedHandler([&](const sim::Status& s) {
    handler_thread = std::this_thread::get_id();
    seen = buf->read(0);
    ok = s.ok;
  });
  cb->commit();
  device().waitIdle();
  EXPECT_EQ(seen.load(), 42);
  EXPECT_FALSE(ok.load());
  EXPECT_NE(handler_thread, std::this_thread::get_id());
  EXPECT_EQ(cb->root()->state(), sim::RootState::kError);
}

TEST_F(SimMetalTest, EncodedBuffersAreRetainedUntilCompletion) {
  auto q = device().newCommandQueue();
  auto buf = device().newBuffer(1);
  q->pause();
  auto cb = q->makeCommandBuffer();
  auto enc = cb->computeEncoder();
  enc->dispatch(write(buf, 1));
  enc->dispatch(write(buf, 2));
  enc->endEncoding();
  EXPECT_EQ(buf->retainCount(), 3);
  cb->commit();
  EXPECT_EQ(buf->retainCount(), 3);
  q->resume();
  cb->waitUntilCompleted();
  EXPECT_EQ(buf->retainCount(), 1);
}

TEST_F(SimMetalTest, BufferOverExternalMemoryReadsAndWritesThatMemory) {
  int64_t memory[4] = {1, 2, 3, 4};
  auto buf = device().newBuffer(
      0, sizeof(memory), reinterpret_cast<unsigned char*>(memory));
  EXPECT_EQ(reinterpret_cast<int64_t*>(buf->contents())[2], 3);
  reinterpret_cast<int64_t*>(buf->contents())[0] = 9;
  EXPECT_EQ(memory[0], 9);
}

TEST_F(SimMetalTest, PendingCountsCommittedWorkThatHasNotStarted) {
  auto q = device().newCommandQueue();
  q->pause();
  auto a = q->makeCommandBuffer();
  auto b = q->makeCommandBuffer();
  EXPECT_EQ(q->pending(), 0u); // made, not committed
  a->commit();
  b->commit();
  EXPECT_EQ(q->pending(), 2u);
  q->resume();
  b->waitUntilCompleted();
  EXPECT_EQ(q->pending(), 0u);
}

TEST_F(SimMetalTest, MakeCommandBufferBlocksAtTheInflightCap) {
  config_.max_inflight = 2;
  SetUp();
  auto q = device().newCommandQueue();
  q->pause();
  auto a = q->makeCommandBuffer();
  auto b = q->makeCommandBuffer();
  a->commit();
  b->commit();
  std::atomic<bool> made{false};
  std::thread t([&] {
    q->makeCommandBuffer()->commit();
    made = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(made.load());
  q->resume();
  t.join();
  EXPECT_TRUE(made.load());
}

TEST_F(SimMetalTest, SharedEventValuesOnlyRise) {
  auto ev = device().newSharedEvent();
  ev->setSignaledValue(5);
  ev->setSignaledValue(0); // what v2.9.1's MPSEvent::reset writes
  ev->setSignaledValue(3);
  EXPECT_EQ(ev->signaledValue(), 5u);
}

TEST_F(SimMetalTest, GpuWaitOnAnotherQueueOrdersWorkAndMayPrecedeSignal) {
  config_.min_latency = std::chrono::microseconds(500);
  config_.max_latency = std::chrono::microseconds(500);
  SetUp();
  auto producer = device().newCommandQueue();
  auto consumer = device().newCommandQueue();
  auto buf = device().newBuffer(1);
  auto ev = device().newSharedEvent();
  std::atomic<int64_t> consumed{-1};

  // The wait is encoded and committed before the producer even exists.
  auto c = consumer->makeCommandBuffer();
  c->encodeWait(ev, 1);
  auto ce = c->computeEncoder();
  ce->dispatch({{{buf, sim::Access::kRead}}, [&] { consumed = buf->read(0); }});
  ce->endEncoding();
  c->commit();

  auto p = producer->makeCommandBuffer();
  auto pe = p->computeEncoder();
  pe->dispatch(write(buf, 7));
  pe->endEncoding();
  p->encodeSignal(ev, 1);
  p->commit();

  c->waitUntilCompleted();
  EXPECT_EQ(consumed.load(), 7);
  EXPECT_EQ(c->root()->state(), sim::RootState::kCompleted);
}

TEST_F(SimMetalTest, UnsignaledGpuWaitTimesOutIntoAnError) {
  config_.event_wait_timeout = std::chrono::milliseconds(20);
  SetUp();
  auto q = device().newCommandQueue();
  auto ev = device().newSharedEvent();
  auto cb = q->makeCommandBuffer();
  cb->encodeWait(ev, 1);
  std::string error;
  cb->addCompletedHandler([&](const sim::Status& s) { error = s.error; });
  cb->commit();
  device().waitIdle();
  EXPECT_THAT(error, HasSubstr("timeout"));
}

TEST_F(SimMetalTest, ListenerNotificationsRunOnTheListenerThread) {
  auto ev = device().newSharedEvent();
  ev->setSignaledValue(2);
  std::mutex mu;
  std::vector<uint64_t> fired;
  auto record = [&](uint64_t v) {
    EXPECT_NE(std::this_thread::get_id(), std::thread::id());
    std::lock_guard<std::mutex> lock(mu);
    fired.push_back(v);
  };
  ev->notifyListener(1, record); // already reached
  ev->notifyListener(4, record);
  device().waitIdle();
  EXPECT_THAT(fired, ElementsAre(2u));
  ev->setSignaledValue(4);
  device().waitIdle();
  EXPECT_THAT(fired, ElementsAre(2u, 4u));
}

TEST_F(SimMetalTest, HazardWhenBufferHandedOutWhileAnotherQueueUsesIt) {
  auto a = device().newCommandQueue();
  auto b = device().newCommandQueue();
  auto buf = device().newBuffer(1);
  a->pause();
  auto cb = a->makeCommandBuffer();
  auto enc = cb->computeEncoder();
  enc->dispatch(write(buf, 1));
  enc->endEncoding();
  cb->commit();

  device().hazards().checkHandout(*buf, a.get()); // same queue: ordered
  EXPECT_EQ(device().hazards().count(), 0u);
  device().hazards().checkHandout(*buf, b.get());
  device().hazards().checkHandout(*buf, nullptr);
  EXPECT_THAT(
      device().hazards().reports(),
      ElementsAre(HasSubstr("to queue"), HasSubstr("to the CPU")));
  device().hazards().clear();

  a->resume();
  cb->waitUntilCompleted();
  device().hazards().checkHandout(*buf, b.get());
  EXPECT_EQ(device().hazards().count(), 0u);
}

TEST_F(SimMetalTest, HazardWhenTwoQueuesRunConflictingAccessesTogether) {
  auto a = device().newCommandQueue();
  auto b = device().newCommandQueue();
  auto buf = device().newBuffer(1);
  harness::Latch both_running(2);
  auto submit = [&](sim::Queue& q, sim::Access access) {
    auto cb = q.makeCommandBuffer();
    auto enc = cb->computeEncoder();
    enc->dispatch({{{buf, access}}, [&] { both_running.arriveAndWait(); }});
    enc->endEncoding();
    cb->commit();
    return cb;
  };
  auto ca = submit(*a, sim::Access::kWrite);
  auto cb = submit(*b, sim::Access::kRead);
  ca->waitUntilCompleted();
  cb->waitUntilCompleted();
  EXPECT_THAT(
      device().hazards().reports(), ElementsAre(HasSubstr("at the same time")));
  device().hazards().clear();
}

TEST_F(SimMetalTest, GpuParallelismCapsConcurrentExecutionAcrossQueues) {
  config_.gpu_parallelism = 2;
  config_.min_latency = std::chrono::microseconds(2000);
  config_.max_latency = std::chrono::microseconds(2000);
  SetUp();
  std::atomic<int> running{0}, peak{0};
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<sim::QueuePtr> queues;
  std::vector<sim::CommandBufferPtr> cbs;
  for (int i = 0; i < 6; ++i) {
    queues.push_back(device().newCommandQueue());
    auto cb = queues.back()->makeCommandBuffer();
    auto enc = cb->computeEncoder();
    enc->dispatch(
        {{}, [&] {
           const int now = ++running;
           int p = peak.load();
           while (now > p && !peak.compare_exchange_weak(p, now)) {
           }
           // Until a second kernel runs beside this one, hold the slot: on
           // a loaded machine the two could otherwise miss each other. A
           // simulator that runs one kernel at a time fails the check
           // below after the test's deadline.
           while (peak.load() < 2 && std::chrono::steady_clock::now() < end) {
             std::this_thread::sleep_for(std::chrono::microseconds(100));
           }
           std::this_thread::sleep_for(std::chrono::milliseconds(2));
           --running;
         }});
    enc->endEncoding();
    cb->commit();
    cbs.push_back(cb);
  }
  for (auto& cb : cbs) {
    cb->waitUntilCompleted();
  }
  EXPECT_EQ(peak.load(), 2);
}

TEST_F(SimMetalTest, QueueCreationFaultReturnsNull) {
  device().failNextQueueCreations(1);
  EXPECT_EQ(device().newCommandQueue(), nullptr);
  EXPECT_NE(device().newCommandQueue(), nullptr);
}

TEST_F(SimMetalTest, TeardownReportsCommandBuffersLeftInFlight) {
  std::vector<std::string> seen;
  {
    sim::Device d;
    d.setViolationHandler([&](const std::string& w) { seen.push_back(w); });
    auto q = d.newCommandQueue();
    auto leaked = q->makeCommandBuffer(); // never committed
    q.reset();
    leaked.reset();
  }
  EXPECT_THAT(seen, ElementsAre(HasSubstr("not completed")));
}

TEST(SimMetalDeathTest, ContractViolationAbortsByDefault) {
  EXPECT_DEATH(
      {
        sim::Device d;
        auto q = d.newCommandQueue();
        auto cb = q->makeCommandBuffer();
        cb->commit();
        cb->commit();
      },
      "commit called twice");
}

} // namespace
