// Which streams encoded recently: the count behind "more than one stream is
// active".

#include "SimStream.h"
#include "harness.h"
#include "stream_pool_peer.h"

#include <ATen/mps/MPSSerialDispatch.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace {

using at::mps::kStreamsPerPool;
using at::mps::StreamActivity;
using at::mps::StreamIndex;
using at::mps::StreamSlotPoolTestPeer;
using namespace std::chrono_literals;

const StreamActivity::Clock::time_point t0 =
    StreamActivity::Clock::time_point{} + 3600s;

TEST(StreamActivityTest, CountsStreamsThatEncodedWithinTheWindow) {
  StreamActivity activity;
  EXPECT_EQ(activity.activeStreams(t0), 0);
  activity.noteEncoding(0, t0);
  activity.noteEncoding(3, t0 + 100ms);
  EXPECT_EQ(activity.activeStreams(t0 + 500ms), 2);
  EXPECT_EQ(activity.activeStreams(t0 + 1050ms), 1); // stream 0 went quiet
  EXPECT_EQ(activity.activeStreams(t0 + 1200ms), 0);
  activity.noteEncoding(0, t0 + 1300ms);
  EXPECT_EQ(activity.activeStreams(t0 + 1300ms), 1);
}

TEST(StreamActivityTest, ManyEncodesOfOneStreamCountOnce) {
  StreamActivity activity;
  for (int i = 0; i < 100; ++i) {
    activity.noteEncoding(7, t0 + i * 1ms);
  }
  EXPECT_EQ(activity.activeStreams(t0 + 100ms), 1);
}

TEST(StreamActivityTest, AStampAheadOfTheReadersClockCounts) {
  StreamActivity activity;
  activity.noteEncoding(1, t0 + 10ms); // read its clock after the reader
  EXPECT_EQ(activity.activeStreams(t0), 1);
}

TEST(StreamActivityTest, EveryPoolSlotCanReport) {
  StreamActivity activity;
  for (StreamIndex i = 0; i < kStreamsPerPool; ++i) {
    activity.noteEncoding(i, t0);
  }
  EXPECT_EQ(activity.activeStreams(t0), kStreamsPerPool);
}

TEST(StreamActivityTest, RejectsAnIndexOutsideThePool) {
  StreamActivity activity;
  EXPECT_TORCH_ERROR(activity.noteEncoding(kStreamsPerPool, t0), "index=32");
  EXPECT_TORCH_ERROR(activity.noteEncoding(-1, t0), "index=-1");
}

TEST(StreamActivityTest, ConcurrentNotesAndCountsAreRaceFree) {
  StreamActivity activity;
  constexpr int kThreads = 8;
  const int kIterations = 20000 * harness::stressScale();
  harness::Latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      start.arriveAndWait();
      for (int i = 0; i < kIterations; ++i) {
        activity.noteEncoding(static_cast<StreamIndex>(rng() % 4));
        const int n = activity.activeStreams();
        ASSERT_GE(n, 1);
        ASSERT_LE(n, 4);
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
}

class PoolActivityTest : public harness::SimTest {
 protected:
  void releaseResources() override {
    pool_.reset();
  }
  std::unique_ptr<sim::SimStreamPool> pool_;
};

// Threads that lease streams from the pool and encode on them report their
// slots; the count is the number of distinct streams in use.
TEST_F(PoolActivityTest, CountsTheDistinctPoolStreamsThatEncode) {
  at::mps::StreamPoolOptions options;
  options.is_main_thread = [] { return false; };
  pool_ = std::make_unique<sim::SimStreamPool>(
      std::make_unique<sim::SimStreamBackend>(device()), options);
  StreamActivity activity;
  constexpr int kThreads = 3;
  harness::Latch encoded(kThreads), counted(kThreads + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      sim::SimStream& stream = pool_->currentStream(); // leases a slot
      activity.noteEncoding(stream.index());
      stream.encodeKernel({{}, [] {}}, at::mps::SyncType::COMMIT_AND_WAIT);
      encoded.countDown();
      counted.arriveAndWait(); // keep the lease until counted
    });
  }
  encoded.wait();
  EXPECT_EQ(activity.activeStreams(), kThreads);
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(pool_->slots()), kThreads);
  counted.arriveAndWait();
  for (auto& th : threads) {
    th.join();
  }
}

} // namespace
