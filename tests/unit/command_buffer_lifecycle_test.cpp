// Behaviour of the portable command-buffer lifecycle, on the simulator and on
// a hand-driven fake that lets a test complete buffers in any order.

#include "SimStream.h"
#include "harness.h"

#include <ATen/mps/MPSCommandBufferLifecycle.h>

#include <atomic>
#include <thread>

namespace {

using at::mps::CompletionStatus;
using at::mps::SyncType;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class LifecycleTest : public harness::SimTest {
 protected:
  void SetUp() override {
    harness::SimTest::SetUp();
    queue_ = device().newCommandQueue();
  }
  void releaseResources() override {
    streams_.clear();
    queue_.reset();
  }
  sim::SimStream& makeStream(bool commit_and_continue) {
    streams_.push_back(std::make_unique<sim::SimStream>(
        device().newCommandQueue(), 0, commit_and_continue));
    return *streams_.back();
  }
  static sim::Kernel write(const sim::BufferPtr& b, int64_t v) {
    return {{{b, sim::Access::kWrite}}, [b, v] { b->write(0, v); }};
  }

  sim::QueuePtr queue_;
  std::vector<std::unique_ptr<sim::SimStream>> streams_;
};

TEST_F(LifecycleTest, CreatesOneBufferLazilyAndCoalescesKernels) {
  auto& s = makeStream(false);
  auto& lc = s.lifecycle();
  auto cb = lc.commandBuffer();
  EXPECT_EQ(lc.commandBuffer(), cb);
  auto enc = lc.commandEncoder();
  EXPECT_EQ(lc.commandEncoder(), enc);
  lc.endKernelCoalescing();
  EXPECT_TRUE(enc->ended());
  EXPECT_NE(lc.commandEncoder(), enc); // a new pass in the same buffer
  EXPECT_EQ(lc.commandBuffer(), cb);
  lc.synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_NE(lc.commandBuffer(), cb);
  lc.synchronize(SyncType::COMMIT_AND_WAIT);
}

TEST_F(LifecycleTest, PendingCommitPointCoversEncodedWork) {
  auto& s = makeStream(false);
  auto buf = device().newBuffer(1);
  auto& lc = s.lifecycle();
  EXPECT_EQ(lc.pendingCommitPoint(), 0u);
  s.encodeKernel(write(buf, 1), SyncType::NONE);
  EXPECT_EQ(lc.pendingCommitPoint(), 1u); // will ride on the next commit
  s.synchronize(SyncType::COMMIT);
  EXPECT_EQ(lc.pendingCommitPoint(), 1u);
  lc.waitForCommitPoint(lc.pendingCommitPoint());
  EXPECT_EQ(buf->read(0), 1);
}

TEST_F(LifecycleTest, CommitAndWaitMakesTheWorkVisible) {
  auto& s = makeStream(false);
  auto buf = device().newBuffer(1);
  s.encodeKernel(write(buf, 11), SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(buf->read(0), 11);
  EXPECT_EQ(s.lifecycle().completedCommitPoint(), 1u);
}

TEST_F(LifecycleTest, SynchronizeWithNothingOpenCreatesNoBuffer) {
  auto& s = makeStream(true);
  const uint64_t before = device().rootsCompleted();
  for (auto t :
       {SyncType::NONE,
        SyncType::COMMIT,
        SyncType::COMMIT_AND_WAIT,
        SyncType::COMMIT_AND_CONTINUE}) {
    s.lifecycle().synchronize(t);
  }
  device().waitIdle();
  EXPECT_EQ(device().rootsCompleted(), before);
  EXPECT_EQ(s.lifecycle().lastCommitPoint(), 0u);
}

TEST_F(LifecycleTest, CommitAndContinueKeepsTheBufferOpenAndWaitStillWorks) {
  auto& s = makeStream(true);
  auto buf = device().newBuffer(1);
  auto& lc = s.lifecycle();
  s.encodeKernel(write(buf, 1), SyncType::COMMIT);
  auto cb = lc.commandBuffer();
  s.encodeKernel(write(buf, 2), SyncType::COMMIT_AND_CONTINUE);
  EXPECT_EQ(lc.commandBuffer(), cb); // the wrapper stays open
  s.encodeKernel(write(buf, 3), SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(buf->read(0), 3);
  EXPECT_EQ(lc.completedCommitPoint(), 3u);
}

TEST_F(LifecycleTest, CleanBufferLeftOpenIsNeitherPendingNorCommitted) {
  auto& s = makeStream(true);
  auto buf = device().newBuffer(1);
  auto& lc = s.lifecycle();
  s.encodeKernel(write(buf, 1), SyncType::COMMIT); // commitAndContinue
  EXPECT_FALSE(lc.hasUncommittedWork());
  EXPECT_EQ(lc.pendingCommitPoint(), 1u);
  s.synchronize(SyncType::COMMIT);
  s.synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(lc.lastCommitPoint(), 1u); // no empty commits
  bool ran = false;
  lc.addCompletedHandler([&](const CompletionStatus&) { ran = true; });
  EXPECT_TRUE(ran); // nothing pending: runs at once
}

TEST_F(LifecycleTest, PlainCommitPolicyClosesTheBufferOnCommit) {
  auto& s = makeStream(false);
  auto buf = device().newBuffer(1);
  s.encodeKernel(write(buf, 1), SyncType::NONE);
  auto cb = s.lifecycle().commandBuffer();
  s.lifecycle().synchronize(SyncType::COMMIT);
  EXPECT_NE(s.lifecycle().commandBuffer(), cb);
  s.lifecycle().synchronize(SyncType::COMMIT_AND_WAIT);
}

TEST_F(LifecycleTest, CommitAndContinueOnADisabledStreamIsAnError) {
  auto& s = makeStream(false);
  EXPECT_TORCH_ERROR(
      s.lifecycle().synchronize(SyncType::COMMIT_AND_CONTINUE),
      "commitAndContinue disabled");
}

TEST_F(LifecycleTest, AdaptiveCommitFollowsTheLowWatermark) {
  auto& s = makeStream(false);
  auto buf = device().newBuffer(1);
  s.encodeKernel(write(buf, 1), SyncType::COMMIT_ADAPTIVE);
  EXPECT_EQ(s.lifecycle().lastCommitPoint(), 0u);
  s.ops().low_watermark->store(true);
  s.encodeKernel(write(buf, 2), SyncType::COMMIT_ADAPTIVE);
  EXPECT_EQ(s.lifecycle().lastCommitPoint(), 1u);
  s.lifecycle().synchronize(SyncType::COMMIT_AND_WAIT);
}

TEST_F(LifecycleTest, HandlerJoinsTheOpenBufferThatCarriesTheWork) {
  auto& s = makeStream(false);
  auto buf = device().newBuffer(1);
  s.queue().pause();
  s.encodeKernel(write(buf, 9), SyncType::NONE);
  std::atomic<int64_t> seen{-1};
  s.lifecycle().addCompletedHandler(
      [&](const CompletionStatus&) { seen = buf->read(0); });
  s.lifecycle().synchronize(SyncType::COMMIT);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(seen.load(), -1);
  s.queue().resume();
  s.lifecycle().synchronize(SyncType::COMMIT_AND_WAIT);
  device().waitIdle();
  EXPECT_EQ(seen.load(), 9);
}

TEST_F(
    LifecycleTest,
    HandlerAfterCommitWaitsForLastCommitPointWithoutNewBuffer) {
  auto& s = makeStream(false);
  auto buf = device().newBuffer(1);
  s.queue().pause();
  s.encodeKernel(write(buf, 4), SyncType::COMMIT);
  std::atomic<int64_t> seen{-1};
  s.lifecycle().addCompletedHandler(
      [&](const CompletionStatus& st) { seen = st.ok ? buf->read(0) : -2; });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(seen.load(), -1);
  EXPECT_EQ(s.queue().uncompleted(), 1u); // no empty buffer was made
  s.queue().resume();
  s.lifecycle().waitForCommitPoint(1);
  device().waitIdle();
  EXPECT_EQ(seen.load(), 4);
}

TEST_F(LifecycleTest, HandlerWithNothingPendingRunsAtOnce) {
  auto& s = makeStream(false);
  bool ran = false;
  s.lifecycle().addCompletedHandler(
      [&](const CompletionStatus& st) { ran = st.ok; });
  EXPECT_TRUE(ran);
}

TEST_F(LifecycleTest, FailedCommandBufferIsReportedByTheWaitOnce) {
  auto& s = makeStream(false);
  auto buf = device().newBuffer(1);
  device().failNextCommits(1, "pageFault at 0x5c8");
  EXPECT_TORCH_ERROR(
      s.encodeKernel(write(buf, 1), SyncType::COMMIT_AND_WAIT),
      "MPS command buffer execution failed: pageFault at 0x5c8");
  s.encodeKernel(write(buf, 2), SyncType::COMMIT_AND_WAIT); // recovered
  EXPECT_EQ(buf->read(0), 2);
}

TEST_F(LifecycleTest, CompletionHandlerMayUseTheStreamWhileAnotherThreadWaits) {
  // A handler that needs the stream's lock must not deadlock against a
  // thread that is waiting for the same stream (the lock is not held).
  auto& s = makeStream(false);
  auto buf = device().newBuffer(1);
  s.encodeKernel(write(buf, 1), SyncType::NONE);
  std::atomic<bool> inner{false};
  s.lifecycle().addCompletedHandler([&](const CompletionStatus&) {
    s.lifecycle().addCompletedHandler(
        [&](const CompletionStatus&) { inner = true; });
  });
  s.lifecycle().synchronize(SyncType::COMMIT_AND_WAIT);
  device().waitIdle();
  EXPECT_TRUE(inner.load());
}

TEST_F(LifecycleTest, ConcurrentCallersNeverBreakTheStateMachine) {
  config_.widen_encode_windows = true;
  config_.max_latency = std::chrono::microseconds(50);
  SetUp();
  auto& s = makeStream(true);
  auto buf = device().newBuffer(1);
  std::atomic<int> kernels_run{0};
  constexpr int kThreads = 8;
  const int iters = 300 * harness::stressScale();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const SyncType kinds[] = {
          SyncType::NONE,
          SyncType::COMMIT,
          SyncType::COMMIT_AND_CONTINUE,
          SyncType::COMMIT_ADAPTIVE,
          SyncType::COMMIT_AND_WAIT};
      for (int i = 0; i < iters; ++i) {
        s.encodeKernel(
            {{{buf, sim::Access::kRead}}, [&] { kernels_run++; }},
            kinds[(i + t) % 5]);
        if (i % 7 == 0) {
          // The external entry points MPSHooks and the allocator use.
          s.synchronize(SyncType::COMMIT);
          s.addCompletedHandler([](const CompletionStatus&) {});
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  s.lifecycle().synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(kernels_run.load(), kThreads * iters);
  EXPECT_EQ(
      s.lifecycle().completedCommitPoint(), s.lifecycle().lastCommitPoint());
}

// Why every entry point enters the serial section: the lifecycle keeps its
// own state consistent, but an encoder handed out inside one caller's
// sequence can be ended by a synchronize() that bypasses the section.
TEST_F(LifecycleTest, SyncOutsideTheSerialSectionBreaksAnEncoderInUse) {
  auto& s = makeStream(false);
  harness::Latch encoder_taken(1), synced(1);
  std::thread encoder_user([&] {
    s.serial([&](sim::Lifecycle& lc) {
      auto enc = lc.commandEncoder();
      encoder_taken.countDown();
      synced.wait();
      enc->dispatch({{}, nullptr});
    });
  });
  encoder_taken.wait();
  s.lifecycle().synchronize(SyncType::COMMIT); // bypasses the section
  synced.countDown();
  encoder_user.join();
  s.synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_THAT(
      takeViolations(), ElementsAre(HasSubstr("dispatch on an ended encoder")));
}

TEST(CommitAndContinuePolicyTest, DefaultStreamOnlyUnlessOverridden) {
  using at::mps::resolveCommitAndContinue;
  EXPECT_TRUE(resolveCommitAndContinue(0, nullptr));
  EXPECT_FALSE(resolveCommitAndContinue(5, nullptr));
  EXPECT_TRUE(resolveCommitAndContinue(0, ""));
  EXPECT_TRUE(resolveCommitAndContinue(5, "1"));
  EXPECT_FALSE(resolveCommitAndContinue(0, "0"));
  EXPECT_TORCH_ERROR(
      resolveCommitAndContinue(0, "yes"),
      "MPS_ENABLE_COMMIT_AND_CONTINUE='yes' is not valid");
}

// A fake whose buffers complete only when the test says so.
struct ManualOps {
  struct State {
    std::mutex mu;
    int next = 0;
    std::map<int, std::vector<at::mps::CompletionHandler>> handlers;
    std::vector<int> committed;
  };
  using Queue = int;
  using Buffer = int; // 0 is "none"
  using Encoder = int;
  std::shared_ptr<State> st = std::make_shared<State>();

  Buffer makeBuffer(const Queue&) {
    std::lock_guard<std::mutex> l(st->mu);
    return ++st->next;
  }
  Encoder makeComputeEncoder(Buffer b) {
    return b;
  }
  void endEncoding(Encoder) {}
  void commit(Buffer b) {
    std::lock_guard<std::mutex> l(st->mu);
    st->committed.push_back(b);
  }
  void commitAndContinue(Buffer) {}
  void addCompletedHandler(Buffer b, at::mps::CompletionHandler h) {
    std::lock_guard<std::mutex> l(st->mu);
    st->handlers[b].push_back(std::move(h));
  }
  void signalTimeline(Buffer, uint64_t) {}
  bool lowWatermarkReached() {
    return false;
  }
  void complete(Buffer b, CompletionStatus status = {}) {
    std::vector<at::mps::CompletionHandler> hs;
    {
      std::lock_guard<std::mutex> l(st->mu);
      hs = std::move(st->handlers[b]);
    }
    for (auto& h : hs) {
      h(status);
    }
  }
};

TEST(LifecycleTimelineTest, AdvancesOnlyOverContiguousCompletions) {
  ManualOps ops;
  auto st = ops.st;
  {
    at::mps::CommandBufferLifecycle<ManualOps> lc(ops, 0, false);
    std::vector<int> fired;
    for (int i = 0; i < 3; ++i) {
      lc.commandBuffer();
      lc.synchronize(SyncType::COMMIT);
      lc.addCompletedHandler(
          [&, i](const CompletionStatus&) { fired.push_back(i); });
    }
    EXPECT_THAT(st->committed, ElementsAre(1, 2, 3));
    ManualOps driver{st};
    driver.complete(3); // the driver completes out of order
    driver.complete(2);
    EXPECT_EQ(lc.completedCommitPoint(), 0u);
    EXPECT_TRUE(fired.empty());
    driver.complete(1);
    EXPECT_EQ(lc.completedCommitPoint(), 3u);
    EXPECT_THAT(fired, ElementsAre(0, 1, 2));
  }
}

TEST(LifecycleTimelineTest, DeferredHandlerSeesAnErrorOfTheWorkItCovers) {
  ManualOps ops;
  auto st = ops.st;
  at::mps::CommandBufferLifecycle<ManualOps> lc(ops, 0, false);
  lc.commandBuffer();
  lc.synchronize(SyncType::COMMIT);
  std::string error;
  lc.addCompletedHandler(
      [&](const CompletionStatus& s) { error = s.ok ? "ok" : s.error; });
  ManualOps{st}.complete(1, CompletionStatus{false, "invalidResource"});
  EXPECT_EQ(error, "invalidResource");
  EXPECT_TORCH_ERROR(lc.waitForCommitPoint(1), "invalidResource");
}

TEST(LifecycleTimelineTest, TimelineHandlerWaitsForItsPointNotALaterBuffer) {
  ManualOps ops;
  auto st = ops.st;
  at::mps::CommandBufferLifecycle<ManualOps> lc(ops, 0, false);
  std::vector<int> fired;
  lc.commandBuffer();
  lc.synchronize(SyncType::COMMIT); // point 1
  lc.addTimelineHandler(
      1, [&](const CompletionStatus&) { fired.push_back(1); });
  lc.commandBuffer(); // point 2, still open
  lc.addTimelineHandler(
      2, [&](const CompletionStatus&) { fired.push_back(2); });
  lc.synchronize(SyncType::COMMIT);
  ManualOps driver{st};
  driver.complete(2); // a later buffer completing first proves nothing
  EXPECT_TRUE(fired.empty());
  driver.complete(1);
  EXPECT_THAT(fired, ElementsAre(1, 2));
  lc.addTimelineHandler(
      2, [&](const CompletionStatus&) { fired.push_back(3); });
  EXPECT_THAT(fired, ElementsAre(1, 2, 3)); // already reached: inline
}

} // namespace
