// Workarounds for Apple-framework races: one lock per kernel family, and the
// MPSGraph path while more than one stream is active.

#include "harness.h"

#include <ATen/mps/MPSFrameworkWorkarounds.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using harness::getWithin;

using at::mps::preferGraphPath;
using at::mps::preferGraphPathNow;
using at::mps::RacyKernelFamily;
using at::mps::SerializedEncode;
using at::mps::StreamActivity;
using at::mps::streamActivity;
using namespace std::chrono_literals;

// Models the framework-internal state of one kernel class: a second
// concurrent encoder is a failure.
TEST(FamilyLockTest, OneFamilyIsEncodedByOneThreadAtATime) {
  constexpr int kThreads = 8;
  const int kIterations = 2000 * harness::stressScale();
  std::atomic<int> encoders{0};
  std::atomic<int> overlaps{0};
  int framework_state = 0; // unsynchronised on purpose: TSan sees a race
  harness::Latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      start.arriveAndWait();
      for (int i = 0; i < kIterations; ++i) {
        SerializedEncode lock(RacyKernelFamily::kMatrixSolveLU);
        if (encoders.fetch_add(1) != 0) {
          overlaps.fetch_add(1);
        }
        ++framework_state;
        std::this_thread::yield();
        encoders.fetch_sub(1);
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(framework_state, kThreads * kIterations);
}

TEST(FamilyLockTest, DifferentFamiliesDoNotBlockEachOther) {
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;
  auto hold = [&](RacyKernelFamily family) {
    SerializedEncode lock(family);
    std::unique_lock<std::mutex> l(mu);
    ++inside;
    cv.notify_all();
    return cv.wait_for(l, 5s, [&] { return inside == 2; });
  };
  auto a = std::async(
      std::launch::async, hold, RacyKernelFamily::kMatrixMultiplication);
  auto b =
      std::async(std::launch::async, hold, RacyKernelFamily::kLayerNormKernel);
  EXPECT_TRUE(getWithin(a));
  EXPECT_TRUE(getWithin(b));
}

TEST(FamilyLockTest, NestedFamiliesMustFollowTheDeclaredOrder) {
  {
    SerializedEncode lu(RacyKernelFamily::kMatrixDecompositionLU);
    SerializedEncode solve(RacyKernelFamily::kMatrixSolveLU); // in order
  }
  {
    SerializedEncode solve(RacyKernelFamily::kMatrixSolveLU);
    EXPECT_TORCH_ERROR(
        SerializedEncode lu(RacyKernelFamily::kMatrixDecompositionLU),
        "lock 2 (a RacyKernelFamily index) taken while holding the same");
    // The same family twice is reported too, instead of self-deadlocking.
    EXPECT_TORCH_ERROR(
        SerializedEncode again(RacyKernelFamily::kMatrixSolveLU),
        "lock 3 (a RacyKernelFamily index) taken while holding");
  }
  // The failed attempts left nothing held.
  auto other = std::async(std::launch::async, [] {
    SerializedEncode lu(RacyKernelFamily::kMatrixDecompositionLU);
    SerializedEncode solve(RacyKernelFamily::kMatrixSolveLU);
  });
  getWithin(other);
}

TEST(
    GraphPathTest,
    DecisionCountsTheCallersStreamAndOthersThatEncodedRecently) {
  const auto t0 = StreamActivity::Clock::time_point{} + 3600s;
  StreamActivity activity;
  EXPECT_FALSE(preferGraphPath(false, activity, 0, t0));
  EXPECT_TRUE(preferGraphPath(true, activity, 0, t0));
  activity.noteEncoding(5, t0 + 1ms); // a worker stream starts encoding
  EXPECT_TRUE(preferGraphPath(false, activity, 0, t0 + 2ms));
  EXPECT_TRUE(preferGraphPath(false, activity, 5, t0 + 3ms));
  // The worker went quiet; the main stream keeps encoding.
  EXPECT_FALSE(preferGraphPath(false, activity, 0, t0 + 1500ms));
}

// MPS_FORCE_GRAPH_PATH is read once per process, so one test follows its life;
// no other test here may call preferGraphPathNow().
TEST(GraphPathTest, ProcessDecisionRejectsMalformedValuesThenReadsOnce) {
  for (const char* bad : {"true", "2", " 1"}) {
    harness::ScopedEnv env("MPS_FORCE_GRAPH_PATH", bad);
    EXPECT_TORCH_ERROR(
        preferGraphPathNow(2),
        std::string("MPS_FORCE_GRAPH_PATH='") + bad + "' is not valid");
  }
  harness::ScopedEnv env("MPS_FORCE_GRAPH_PATH", nullptr);
  EXPECT_FALSE(preferGraphPathNow(2));
  harness::ScopedEnv later("MPS_FORCE_GRAPH_PATH", "1");
  EXPECT_FALSE(preferGraphPathNow(2));
  EXPECT_GE(streamActivity().activeStreams(), 1);
  streamActivity().noteEncoding(9);
  EXPECT_TRUE(preferGraphPathNow(2));
}

} // namespace
