// Workarounds for Apple-framework races: one lock per kernel family, and the
// MPSGraph path while more than one stream is active.

#include "harness.h"

#include <ATen/mps/MPSFrameworkWorkarounds.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using harness::getWithin;

using at::mps::GraphPathMode;
using at::mps::kRacyKernelFamilies;
using at::mps::parseGraphPathMode;
using at::mps::preferGraphPath;
using at::mps::preferGraphPathNow;
using at::mps::RacyKernelFamily;
using at::mps::racyKernelFamilyName;
using at::mps::SerializedEncode;
using at::mps::StreamActivity;
using at::mps::streamActivity;
using namespace std::chrono_literals;

TEST(FamilyLockTest, EveryFamilyHasItsOwnName) {
  std::set<std::string> names;
  for (int i = 0; i < kRacyKernelFamilies; ++i) {
    names.insert(racyKernelFamilyName(static_cast<RacyKernelFamily>(i)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kRacyKernelFamilies));
  EXPECT_STREQ(
      racyKernelFamilyName(RacyKernelFamily::kMatrixMultiplication),
      "MPSNDArrayMatrixMultiplication");
}

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
        "'MPSMatrixDecompositionLU' taken while holding the same or a later");
    // The same family twice is reported too, instead of self-deadlocking.
    EXPECT_TORCH_ERROR(
        SerializedEncode again(RacyKernelFamily::kMatrixSolveLU),
        "'MPSMatrixSolveLU' taken while holding");
  }
  // The failed attempts left nothing held.
  auto other = std::async(std::launch::async, [] {
    SerializedEncode lu(RacyKernelFamily::kMatrixDecompositionLU);
    SerializedEncode solve(RacyKernelFamily::kMatrixSolveLU);
  });
  getWithin(other);
}

TEST(GraphPathTest, ParsesMpsForceGraphPathStrictly) {
  EXPECT_EQ(parseGraphPathMode(nullptr), GraphPathMode::kAuto);
  EXPECT_EQ(parseGraphPathMode(""), GraphPathMode::kAuto);
  EXPECT_EQ(parseGraphPathMode("0"), GraphPathMode::kAuto);
  EXPECT_EQ(parseGraphPathMode("1"), GraphPathMode::kForce);
  EXPECT_TORCH_ERROR(
      parseGraphPathMode("true"), "MPS_FORCE_GRAPH_PATH='true' is not valid");
  EXPECT_TORCH_ERROR(
      parseGraphPathMode("2"), "1 (always use the MPSGraph path");
}

TEST(GraphPathTest, GraphPathWhileMoreThanOneStreamIsActiveOrWhenForced) {
  EXPECT_FALSE(preferGraphPath(GraphPathMode::kAuto, 0));
  EXPECT_FALSE(preferGraphPath(GraphPathMode::kAuto, 1));
  EXPECT_TRUE(preferGraphPath(GraphPathMode::kAuto, 2));
  EXPECT_TRUE(preferGraphPath(GraphPathMode::kForce, 1));
}

TEST(
    GraphPathTest,
    DecisionCountsTheCallersStreamAndOthersThatEncodedRecently) {
  const auto t0 = StreamActivity::Clock::time_point{} + 3600s;
  StreamActivity activity;
  EXPECT_FALSE(preferGraphPath(GraphPathMode::kAuto, activity, 0, t0));
  EXPECT_TRUE(preferGraphPath(GraphPathMode::kForce, activity, 0, t0));
  activity.noteEncoding(5, t0 + 1ms); // a worker stream starts encoding
  EXPECT_TRUE(preferGraphPath(GraphPathMode::kAuto, activity, 0, t0 + 2ms));
  EXPECT_TRUE(preferGraphPath(GraphPathMode::kAuto, activity, 5, t0 + 3ms));
  // The worker went quiet; the main stream keeps encoding.
  EXPECT_FALSE(preferGraphPath(GraphPathMode::kAuto, activity, 0, t0 + 1500ms));
}

TEST(GraphPathTest, ProcessDecisionUsesTheProcessActivity) {
  harness::ScopedEnv env("MPS_FORCE_GRAPH_PATH", nullptr);
  EXPECT_FALSE(preferGraphPathNow(2));
  EXPECT_GE(streamActivity().activeStreams(), 1);
  streamActivity().noteEncoding(9);
  EXPECT_TRUE(preferGraphPathNow(2));
}

} // namespace
