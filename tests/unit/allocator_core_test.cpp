// Behaviour of the portable allocator core: the cross-stream reuse rule,
// pending frees and their resolution, commit hints, garbage collection, the
// out-of-memory path, statistics and argument checks. First with a
// hand-driven timeline (exact control over which commit points have
// completed), then on simulated streams with the hazard detector watching
// every handout.

#include "allocator_fixture.h"

#include <chrono>
#include <future>
#include <thread>

namespace {

using at::mps::SyncType;
using Core = at::mps::CachingAllocatorCore;
using harness::AllocatorFakeTest;
using harness::AllocatorSimTest;
using harness::census;
using harness::kLarge;
using harness::kScalar;
using harness::kSmall;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::Invoke;
using ::testing::SizeIs;

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

// ------------------------------------------------------------ fake timeline

TEST_F(AllocatorFakeTest, ReusesAFreedBlockOnItsOwnStreamAtOnce) {
  build();
  fake_.setPending(1, 5); // stream 1 still has work in flight
  auto a = alloc(1, 4 * kKiB);
  release(a);
  auto b = alloc(1, 4 * kKiB);
  EXPECT_EQ(b, a);
  EXPECT_EQ(backend_->live(), 1u);
  EXPECT_EQ(core_->stats().allocated_bytes, static_cast<int64_t>(4 * kKiB));
  release(b);
}

TEST_F(AllocatorFakeTest, AnotherStreamGetsTheBlockOnlyOnceItsWorkCompleted) {
  build();
  fake_.setPending(1, 5);
  fake_.completeSilently(1, 4);
  auto a = alloc(1, 4 * kKiB);
  release(a);
  auto b = alloc(2, 4 * kKiB);
  EXPECT_NE(b, a) << "stream 1's commit point 5 may still use it";
  fake_.completeSilently(1, 5);
  auto c = alloc(2, 4 * kKiB);
  EXPECT_EQ(c, a) << "taken from stream 1's cache";
  release(b);
  release(c);
}

TEST_F(
    AllocatorFakeTest,
    RecordedStreamKeepsTheBlockPendingUntilEveryFenceCompletes) {
  build();
  fake_.setPending(1, 3);
  fake_.setPending(2, 7);
  fake_.complete(1, 2);
  fake_.complete(2, 6);
  auto a = alloc(1, 4 * kKiB);
  core_->recordStream(a.get(), 2);
  release(a);
  EXPECT_EQ(core_->stats().pending_bytes, static_cast<int64_t>(4 * kKiB));
  auto b = alloc(1, 4 * kKiB);
  EXPECT_NE(b, a) << "not even its allocation stream may reuse it";
  fake_.complete(1, 3);
  auto c = alloc(3, 4 * kKiB);
  EXPECT_NE(c, a) << "stream 2's use may still be running";
  fake_.complete(2, 7);
  EXPECT_EQ(core_->stats().pending_bytes, 0);
  auto d = alloc(3, 4 * kKiB);
  EXPECT_EQ(d, a) << "free for every stream once all uses completed";
  for (auto& x : {b, c, d}) {
    release(x);
  }
}

TEST_F(
    AllocatorFakeTest,
    CompletionHandlerResolvesPendingBlocksWithoutAMalloc) {
  build();
  fake_.setPending(2, 7);
  EXPECT_CALL(timelines_, onCompleted(2, 7, _));
  auto a = alloc(1, 4 * kKiB);
  core_->recordStream(a.get(), 2);
  release(a);
  EXPECT_EQ(census(*core_).pending_bytes, static_cast<int64_t>(4 * kKiB));
  fake_.complete(2, 7); // runs the handler the core registered
  const auto c = census(*core_);
  EXPECT_EQ(c.pending_bytes, 0);
  EXPECT_EQ(c.free_bytes, static_cast<int64_t>(4 * kKiB));
  EXPECT_EQ(fake_.waitingHandlers(), 0u);
}

TEST_F(AllocatorFakeTest, MallocResolvesPendingBlocksLazily) {
  build();
  fake_.setPending(2, 7);
  auto a = alloc(1, 4 * kKiB);
  core_->recordStream(a.get(), 2);
  release(a);
  fake_.completeSilently(2, 7); // no handler has run yet
  auto b = alloc(3, 4 * kKiB);
  EXPECT_EQ(b, a);
  release(b);
  fake_.complete(2, 7);
}

TEST_F(
    AllocatorFakeTest,
    RegistersOneCompletionHandlerPerStreamAndCommitPoint) {
  build();
  EXPECT_CALL(timelines_, onCompleted(2, 7, _));
  EXPECT_CALL(timelines_, onCompleted(2, 8, _));
  fake_.setPending(2, 7);
  std::vector<sim::BufferPtr> blocks;
  for (int i = 0; i < 10; ++i) {
    blocks.push_back(alloc(1, 4 * kKiB));
  }
  for (auto& b : blocks) {
    core_->recordStream(b.get(), 2);
    release(b);
  }
  fake_.setPending(2, 8);
  auto last = alloc(1, 4 * kKiB);
  core_->recordStream(last.get(), 2);
  release(last);
  fake_.complete(2, 8);
  EXPECT_EQ(census(*core_).free_bytes, static_cast<int64_t>(11 * 4 * kKiB));
}

TEST_F(
    AllocatorFakeTest,
    AMissWithOnlyPendingBlocksAsksForOneCommitAndAllocates) {
  build();
  fake_.setPending(2, 7);
  fake_.complete(2, 6);
  auto a = alloc(1, 4 * kKiB);
  core_->recordStream(a.get(), 2);
  release(a);
  EXPECT_CALL(timelines_, requestCommit(2)).Times(1);
  auto b = alloc(3, 4 * kKiB);
  auto c = alloc(3, 4 * kKiB);
  EXPECT_NE(b, a);
  EXPECT_NE(c, a);
  EXPECT_EQ(backend_->live(), 3u);
  release(b);
  release(c);
  fake_.complete(2, 7);
}

// Every call into the streams is made with no allocator lock held: a probe
// thread that takes every pool and cache lock (census) and the shard locks
// of the test's blocks must get through while the call is in progress.
TEST_F(AllocatorFakeTest, NeverCallsIntoStreamsWhileHoldingAnAllocatorLock) {
  build(8 * kMiB);
  std::vector<const void*> keys;
  std::vector<std::future<void>> probes;
  int stuck = 0;
  const auto probe = [&] {
    auto f = std::async(std::launch::async, [this, keys] {
      census(*core_);
      for (const void* k : keys) {
        Core::LockedBuffer<>(*core_, k);
      }
    });
    if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ++stuck;
    }
    probes.push_back(std::move(f));
  };
  ON_CALL(timelines_, pendingPoint(_)).WillByDefault(Invoke([&](auto s) {
    probe();
    return fake_.pending(s);
  }));
  ON_CALL(timelines_, completedPoint(_)).WillByDefault(Invoke([&](auto s) {
    probe();
    return fake_.completed(s);
  }));
  ON_CALL(timelines_, requestCommit(_)).WillByDefault(Invoke([&](auto) {
    probe();
  }));
  ON_CALL(timelines_, onCompleted(_, _, _))
      .WillByDefault(Invoke([&](auto s, uint64_t v, auto fn) {
        probe();
        fake_.onCompleted(s, v, std::move(fn));
      }));
  ON_CALL(timelines_, waitFor(_, _)).WillByDefault(Invoke([&](auto s, auto v) {
    probe();
    fake_.complete(s, v);
  }));
  EXPECT_CALL(timelines_, pendingPoint(_)).Times(::testing::AtLeast(1));
  EXPECT_CALL(timelines_, completedPoint(_)).Times(::testing::AtLeast(1));
  EXPECT_CALL(timelines_, requestCommit(_)).Times(::testing::AtLeast(1));
  EXPECT_CALL(timelines_, onCompleted(_, _, _)).Times(::testing::AtLeast(1));
  EXPECT_CALL(timelines_, waitFor(_, _)).Times(::testing::AtLeast(1));

  fake_.setPending(1, 3);
  fake_.setPending(2, 7);
  auto a = alloc(1, 4 * kMiB, kLarge); // same-stream free
  auto b = alloc(1, 2 * kMiB, kLarge); // pending free
  keys = {a.get(), b.get()};
  release(a);
  core_->recordStream(b.get(), 2);
  release(b);
  auto c = alloc(3, 2 * kMiB, kLarge); // miss: lazy resolve, steal, commit
  keys.push_back(c.get());
  auto d = alloc(3, 4 * kMiB, kLarge); // out of memory: waits, releases
  keys.push_back(d.get());
  EXPECT_EQ(stuck, 0) << "a stream call ran under an allocator lock";
  probes.clear();
  release(c);
  release(d);
  ::testing::Mock::VerifyAndClearExpectations(&timelines_);
  timelines_.delegateTo(fake_);
}

TEST_F(
    AllocatorFakeTest,
    GarbageCollectsTheOldestCachedBlocksUnderMemoryPressure) {
  build();
  core_->setLowWatermark(3 * kMiB);
  std::vector<sim::BufferPtr> x;
  for (int i = 0; i < 4; ++i) {
    x.push_back(alloc(1, kMiB, kLarge));
  }
  for (int i = 0; i < 3; ++i) {
    release(x[i]); // x[0] is the oldest
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // 4 MiB in use on the device, 1 MiB over the watermark.
  auto big = alloc(1, 2 * kMiB, kLarge);
  EXPECT_EQ(backend_->live(), 4u) << "one block released";
  EXPECT_FALSE(Core::LockedBuffer<>(*core_, x[0].get()))
      << "the oldest block goes first";
  EXPECT_TRUE(Core::LockedBuffer<>(*core_, x[1].get()));
  EXPECT_TRUE(Core::LockedBuffer<>(*core_, x[2].get()));
  release(big);
  release(x[3]);
}

TEST_F(AllocatorFakeTest, DoesNotReuseOversizedBlocksUnderMemoryPressure) {
  build();
  auto a = alloc(1, 4 * kMiB, kLarge);
  release(a);
  auto b = alloc(1, kMiB, kLarge);
  EXPECT_EQ(b, a) << "no pressure: an oversized block is still reused";
  release(b);
  core_->setLowWatermark(1);
  auto c = alloc(1, kMiB, kLarge);
  EXPECT_NE(c, a) << "3 MiB over the request, max_oversize is 1 MiB";
  release(c);
}

TEST_F(
    AllocatorFakeTest,
    OutOfMemoryReleasesCachedBlocksOfOtherPoolsAndRetries) {
  build(4 * kMiB);
  std::vector<sim::BufferPtr> small;
  for (int i = 0; i < 4; ++i) {
    small.push_back(alloc(1, kMiB, kSmall));
  }
  for (auto& b : small) {
    release(b);
  }
  int callbacks = 0;
  backend_->on_allocation_failed = [&] { ++callbacks; };
  auto big = alloc(2, 2 * kMiB, kLarge);
  EXPECT_EQ(callbacks, 1);
  EXPECT_EQ(backend_->live(), 1u) << "the four small blocks released";
  release(big);
}

TEST_F(AllocatorFakeTest, OutOfMemoryWaitsForTheWorkCachedBlocksWaitOn) {
  build(2 * kMiB);
  fake_.setPending(1, 5);
  fake_.complete(1, 4);
  auto a = alloc(1, 2 * kMiB, kLarge);
  release(a); // cached for stream 1, fence 5 still running
  EXPECT_CALL(timelines_, waitFor(1, 5));
  auto b = alloc(2, 2 * kMiB, kLarge);
  release(b);
}

TEST_F(AllocatorFakeTest, OutOfMemoryRaisesAnErrorNamingThePool) {
  build(kMiB);
  EXPECT_TORCH_ERROR(alloc(1, 2 * kMiB, kLarge), "MPS backend out of memory");
  EXPECT_TORCH_ERROR(alloc(1, 2 * kMiB, kLarge), "on the large pool");
  EXPECT_EQ(core_->stats().reserved_bytes, 0);
}

TEST_F(
    AllocatorFakeTest,
    EmptyCacheWaitsForTheStreamsItsBlocksWaitOnAndReleasesAll) {
  build();
  fake_.setPending(1, 3);
  fake_.setPending(2, 9);
  auto a = alloc(1, 4 * kKiB);
  auto b = alloc(1, 4 * kKiB);
  release(a);
  core_->recordStream(b.get(), 2);
  release(b);
  EXPECT_CALL(timelines_, waitFor(1, 3));
  EXPECT_CALL(timelines_, waitFor(2, 9));
  core_->emptyCache();
  EXPECT_EQ(core_->stats().reserved_bytes, 0);
  EXPECT_EQ(backend_->live(), 0u);
}

TEST_F(AllocatorFakeTest, UntrackedPoolWaitsForCompletionEvenOnTheSameStream) {
  build();
  fake_.setPending(1, 5);
  fake_.complete(1, 4);
  auto a = alloc(1, 8, kScalar);
  release(a);
  auto b = alloc(1, 8, kScalar);
  EXPECT_NE(b, a);
  fake_.complete(1, 5);
  auto c = alloc(1, 8, kScalar);
  EXPECT_EQ(c, a);
  release(b);
  release(c);
}

TEST_F(AllocatorFakeTest, StatisticsAreExact) {
  build();
  auto a = alloc(1, 4 * kKiB);
  auto b = alloc(2, 8 * kKiB);
  auto c = alloc(3, kMiB, kLarge);
  release(b);
  auto d = alloc(2, 8 * kKiB); // reuses b
  release(a);
  auto s = core_->stats();
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(12 * kKiB + kMiB));
  EXPECT_EQ(s.allocated_bytes, static_cast<int64_t>(8 * kKiB + kMiB));
  EXPECT_EQ(s.pending_bytes, 0);
  EXPECT_EQ(backend_->live(), 3u);
  const auto where = census(*core_);
  EXPECT_EQ(where.stream_cached_bytes, static_cast<int64_t>(4 * kKiB));
  EXPECT_EQ(where.blocks, 1);
  release(c);
  release(d);
  core_->emptyCache();
  s = core_->stats();
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(backend_->used(), 0u);
}

TEST_F(AllocatorFakeTest, RejectsBadArgumentsNamingThem) {
  build();
  EXPECT_TORCH_ERROR(core_->malloc(3, 16, 1), "pool=3 is out of range");
  EXPECT_TORCH_ERROR(core_->malloc(-1, 16, 1), "pool=-1 is out of range");
  EXPECT_TORCH_ERROR(
      core_->malloc(kSmall, 16, 32), "stream index out of range: index=32");
  EXPECT_TORCH_ERROR(
      core_->malloc(kSmall, 16, -1), "stream index out of range: index=-1");
  EXPECT_TORCH_ERROR(core_->malloc(kSmall, 0, 1), "malloc() of size 0");
  int foreign = 0;
  EXPECT_TORCH_ERROR(core_->free(&foreign), "not an allocated block");
  auto a = alloc(1, 16);
  EXPECT_TORCH_ERROR(core_->recordStream(a.get(), 40), "index=40");
  release(a);
  EXPECT_TORCH_ERROR(release(a), "double free");
  EXPECT_TORCH_ERROR(
      core_->recordStream(a.get(), 2), "recordStream() of a pointer");
  EXPECT_TORCH_ERROR(
      harness::AllocatorCore(*backend_, timelines_, {}), "`pools` is empty");
}

// ------------------------------------------------------- simulated streams

TEST_F(AllocatorSimTest, CrossStreamHandOffWithRecordStreamIsSafe) {
  build();
  auto& a = stream(1);
  auto& b = stream(2);
  stream(3);
  auto x = alloc(1, 4 * kKiB);
  a.encodeKernel(write(x, 1), SyncType::COMMIT_AND_WAIT);
  b.queue().pause(); // B's read stays in flight
  b.encodeKernel(read(x), SyncType::COMMIT);
  core_->recordStream(x.get(), 2);
  release(x);
  auto y = alloc(1, 4 * kKiB);
  auto z = alloc(3, 4 * kKiB);
  EXPECT_NE(y, x);
  EXPECT_NE(z, x);
  b.queue().resume();
  b.synchronize(SyncType::COMMIT_AND_WAIT);
  device().waitIdle(); // completion handlers have run
  EXPECT_EQ(census(*core_).free_bytes, static_cast<int64_t>(4 * kKiB))
      << "B's completion handler resolved the block";
  auto w = alloc(3, 4 * kKiB);
  EXPECT_EQ(w, x);
  for (auto& p : {y, z, w}) {
    release(p);
  }
}

// What the rule cannot see: a use on stream B that was never recorded. The
// block goes back to A's cache, A gets it at once, and the hazard detector
// reports exactly the race the user must prevent with recordStream().
TEST_F(
    AllocatorSimTest,
    WithoutRecordStreamReuseOnTheAllocationStreamIsAHazard) {
  build();
  auto& a = stream(1);
  auto& b = stream(2);
  auto x = alloc(1, 4 * kKiB);
  a.encodeKernel(write(x, 1), SyncType::COMMIT_AND_WAIT);
  b.queue().pause();
  b.encodeKernel(read(x), SyncType::COMMIT);
  release(x); // no recordStream(x, B)
  auto y = alloc(1, 4 * kKiB);
  EXPECT_EQ(y, x);
  const auto reports = device().hazards().reports();
  ASSERT_THAT(reports, SizeIs(1));
  EXPECT_THAT(reports[0], HasSubstr("may still read it"));
  device().hazards().clear();
  release(y);
  b.queue().resume();
}

TEST_F(AllocatorSimTest, SameStreamReuseWhileTheGpuStillRunsKeepsOrder) {
  build();
  auto& a = stream(1);
  a.queue().pause();
  auto x = alloc(1, 4 * kKiB);
  a.encodeKernel(write(x, 1), SyncType::COMMIT);
  release(x);
  auto y = alloc(1, 4 * kKiB); // no hazard: same queue, in order
  EXPECT_EQ(y, x);
  a.encodeKernel(write(y, 2), SyncType::COMMIT);
  a.queue().resume();
  a.synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(y->read(0), 2);
  release(y);
}

TEST_F(
    AllocatorSimTest,
    AnotherStreamGetsTheBlockOnlyAfterTheOwnersWorkCompletes) {
  build();
  auto& a = stream(1);
  stream(3);
  a.queue().pause();
  auto x = alloc(1, 4 * kKiB);
  a.encodeKernel(write(x, 1), SyncType::COMMIT);
  release(x);
  auto z = alloc(3, 4 * kKiB);
  EXPECT_NE(z, x);
  a.queue().resume();
  a.synchronize(SyncType::COMMIT_AND_WAIT);
  auto w = alloc(3, 4 * kKiB);
  EXPECT_EQ(w, x);
  release(z);
  release(w);
}

TEST_F(AllocatorSimTest, ScalarBlocksGoToTheCpuOnlyWhenIdle) {
  build();
  auto& a = stream(1);
  a.queue().pause();
  auto s = alloc(1, 8, kScalar);
  a.encodeKernel(read(s), SyncType::COMMIT);
  release(s);
  auto t = alloc(1, 8, kScalar); // checked as a handout to the CPU
  EXPECT_NE(t, s);
  a.queue().resume();
  a.synchronize(SyncType::COMMIT_AND_WAIT);
  device().waitIdle();
  auto u = alloc(1, 8, kScalar);
  EXPECT_EQ(u, s);
  release(t);
  release(u);
}

TEST_F(AllocatorSimTest, EmptyCacheCommitsOtherStreamsAndReleasesEverything) {
  build();
  auto& b = stream(2);
  auto x = alloc(1, 4 * kKiB);
  b.encodeKernel(read(x), SyncType::NONE); // open, uncommitted on B
  core_->recordStream(x.get(), 2);
  release(x);
  x.reset();
  core_->emptyCache();
  EXPECT_EQ(backend_->live(), 0u);
  EXPECT_EQ(core_->stats().reserved_bytes, 0);
  EXPECT_EQ(b.lifecycle().completedCommitPoint(), 1u);
}

} // namespace
