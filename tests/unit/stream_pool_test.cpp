// Behaviour of the portable stream pool: lazy creation, leasing, the
// exhaustion policies, the explicit API, fork and shutdown.

#include "SimStream.h"
#include "harness.h"
#include "stream_pool_peer.h"

#include <ATen/mps/MPSStreamPool.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

namespace {

using at::mps::ExhaustionConfig;
using at::mps::ExhaustionPolicy;
using at::mps::kStreamsPerPool;
using at::mps::kWorkerStreams;
using at::mps::StreamIndex;
using at::mps::StreamSlotPoolTestPeer;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::Invoke;
using ::testing::NiceMock;
using ::testing::Return;
using ::testing::StrictMock;

struct FakeStream {
  StreamIndex index;
};

class MockBackend : public at::mps::StreamBackend<FakeStream> {
 public:
  MockBackend() {
    ON_CALL(*this, create(_)).WillByDefault(Invoke([](StreamIndex i) {
      return std::make_unique<FakeStream>(FakeStream{i});
    }));
  }
  MOCK_METHOD(std::unique_ptr<FakeStream>, create, (StreamIndex), (override));
  MOCK_METHOD(void, synchronize, (FakeStream&), (override));
  MOCK_METHOD(void, onLeaseReleased, (FakeStream&), (override));
};

using Pool = at::mps::StreamPool<FakeStream>;

at::mps::StreamPoolOptions options(
    ExhaustionConfig cfg = {},
    bool main_thread = false) {
  at::mps::StreamPoolOptions o;
  o.exhaustion = cfg;
  o.is_main_thread = [main_thread] { return main_thread; };
  return o;
}

// Builds a pool around a NiceMock backend and keeps a pointer to the mock.
struct PoolUnderTest {
  explicit PoolUnderTest(at::mps::StreamPoolOptions o = options()) {
    auto b = std::make_unique<NiceMock<MockBackend>>();
    backend = b.get();
    pool = std::make_unique<Pool>(std::move(b), std::move(o));
  }
  NiceMock<MockBackend>* backend;
  std::unique_ptr<Pool> pool;
};

// Runs fn on a new thread and returns its result (or rethrows).
template <typename Fn>
auto onThread(Fn fn) -> decltype(fn()) {
  std::promise<decltype(fn())> p;
  std::thread([&] {
    try {
      p.set_value(fn());
    } catch (...) {
      p.set_exception(std::current_exception());
    }
  }).join();
  return p.get_future().get();
}

// Holds n worker leases on n threads until release() is called.
class LeaseHolders {
 public:
  LeaseHolders(Pool& pool, int n) : ready_(n), go_(1) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, &pool] {
        pool.slots().currentIndex();
        ready_.countDown();
        go_.wait();
      });
    }
    ready_.wait();
  }
  void release() {
    go_.countDown();
    for (auto& t : threads_) {
      t.join();
    }
    threads_.clear();
  }
  ~LeaseHolders() {
    release();
  }

 private:
  harness::Latch ready_, go_;
  std::vector<std::thread> threads_;
};

// ------------------------------------------------------------ creation

TEST(StreamPoolTest, CreatesEachStreamLazilyExactlyOnceUnderContention) {
  auto b = std::make_unique<StrictMock<MockBackend>>();
  EXPECT_CALL(*b, create(7)).WillOnce(Invoke([](StreamIndex i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return std::make_unique<FakeStream>(FakeStream{i});
  }));
  Pool pool(std::move(b), options());
  std::vector<std::thread> threads;
  std::set<FakeStream*> seen;
  std::mutex mu;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      FakeStream* s = &pool.stream(7);
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(s);
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ((*seen.begin())->index, 7);
}

TEST(StreamPoolTest, FailedCreationRaisesAndLeavesSlotCreatable) {
  PoolUnderTest t;
  EXPECT_CALL(*t.backend, create(3))
      .WillOnce(Invoke([](StreamIndex) -> std::unique_ptr<FakeStream> {
        throw std::runtime_error("device lost");
      }))
      .WillOnce(Return(nullptr))
      .WillOnce(Invoke([](StreamIndex i) {
        return std::make_unique<FakeStream>(FakeStream{i});
      }));
  EXPECT_THROW(t.pool->stream(3), std::runtime_error);
  EXPECT_TORCH_ERROR(
      t.pool->stream(3), "creating the stream for slot 3 failed");
  EXPECT_EQ(t.pool->stream(3).index, 3);
}

TEST(StreamPoolTest, RejectsOutOfRangeIndices) {
  PoolUnderTest t;
  EXPECT_TORCH_ERROR(t.pool->stream(-1), "index=-1");
  EXPECT_TORCH_ERROR(t.pool->stream(kStreamsPerPool), "index=32");
  EXPECT_TORCH_ERROR(t.pool->slots().exchangeCurrentIndex(40), "index=40");
}

TEST(StreamPoolTest, RejectsNullBackend) {
  EXPECT_TORCH_ERROR(Pool(nullptr, options()), "backend must not be null");
}

// ------------------------------------------------------------ leasing

TEST(StreamPoolTest, MainThreadUsesDefaultStreamWithoutLease) {
  PoolUnderTest t(options({}, /*main_thread=*/true));
  EXPECT_EQ(t.pool->slots().currentIndex(), 0);
  EXPECT_EQ(t.pool->currentStream().index, 0);
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), 0);
  EXPECT_FALSE(t.pool->slots().currentThreadHoldsLease());
}

TEST(StreamPoolTest, ProcessMainThreadDetectionDefaultsToRealMainThread) {
  at::mps::StreamPoolOptions o; // no override: the gtest main thread
  auto b = std::make_unique<NiceMock<MockBackend>>();
  Pool pool(std::move(b), o);
  EXPECT_TRUE(at::mps::isProcessMainThread());
  EXPECT_EQ(pool.slots().currentIndex(), 0);
  EXPECT_NE(onThread([&] { return pool.slots().currentIndex(); }), 0);
}

TEST(StreamPoolTest, WorkerThreadsLeaseDistinctSlotsExclusively) {
  PoolUnderTest t;
  constexpr int kThreads = kWorkerStreams;
  harness::Latch all_leased(kThreads), all_counted(kThreads);
  std::vector<std::thread> threads;
  std::vector<StreamIndex> got(kThreads);
  std::vector<int> leased_seen(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      got[i] = t.pool->slots().currentIndex();
      EXPECT_EQ(t.pool->slots().currentIndex(), got[i]); // stable
      EXPECT_TRUE(t.pool->slots().currentThreadHoldsLease());
      all_leased.arriveAndWait();
      leased_seen[i] = StreamSlotPoolTestPeer::leasedSlots(t.pool->slots());
      all_counted.arriveAndWait();
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  std::set<StreamIndex> distinct(got.begin(), got.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(*distinct.begin(), 1);
  EXPECT_EQ(*distinct.rbegin(), kStreamsPerPool - 1);
  EXPECT_THAT(leased_seen, ::testing::Each(kThreads));
  EXPECT_EQ(
      StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()),
      0); // returned at thread exit
}

TEST(StreamPoolTest, ReleasedSlotIsReusedAndHookFlushesIt) {
  PoolUnderTest t;
  // Explicit release, then the first thread's exit, then the second's.
  EXPECT_CALL(*t.backend, onLeaseReleased(_))
      .Times(3)
      .WillRepeatedly(Invoke([](FakeStream& s) { EXPECT_EQ(s.index, 1); }));
  onThread([&] {
    EXPECT_EQ(t.pool->currentStream().index, 1);
    t.pool->slots().releaseCurrentThreadSlot();
    EXPECT_FALSE(t.pool->slots().currentThreadHoldsLease());
    EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), 0);
    EXPECT_EQ(t.pool->slots().currentIndex(), 1); // leases again on next use
    return 0;
  });
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), 0);
  EXPECT_EQ(onThread([&] { return t.pool->slots().currentIndex(); }), 1);
}

TEST(StreamPoolTest, ReleaseWithoutLeaseIsANoOp) {
  PoolUnderTest t(options({}, /*main_thread=*/true));
  EXPECT_CALL(*t.backend, onLeaseReleased(_)).Times(0);
  t.pool->slots().exchangeCurrentIndex(5);
  t.pool->slots().releaseCurrentThreadSlot();
  EXPECT_EQ(t.pool->slots().currentIndex(), 5);
}

TEST(StreamPoolTest, ThreadsBindPerPool) {
  PoolUnderTest a, b;
  onThread([&] {
    EXPECT_EQ(a.pool->slots().currentIndex(), 1);
    a.pool->slots().exchangeCurrentIndex(9);
    EXPECT_EQ(b.pool->slots().currentIndex(), 1);
    EXPECT_EQ(a.pool->slots().currentIndex(), 9);
    EXPECT_EQ(b.pool->slots().currentIndex(), 1);
    return 0;
  });
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(a.pool->slots()), 0);
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(b.pool->slots()), 0);
}

// ------------------------------------------------------------ main thread
// Note [MPS main thread lookup]

// The main thread's lookups read its pool's copy of its cache: it must
// follow every change of the thread's current slot, and only that pool's.
TEST(StreamPoolTest, TheMainThreadsCopyFollowsItsCurrentSlot) {
  using at::mps::detail::tls_slot_cache;
  PoolUnderTest t(options({}, /*main_thread=*/true));
  // The copy holds the stream exactly when the thread's cache does.
  const auto agree = [&] {
    return StreamSlotPoolTestPeer::mainCopy(t.pool->slots()) ==
        tls_slot_cache.stream;
  };
  EXPECT_EQ(t.pool->currentStream().index, 0);
  ASSERT_TRUE(StreamSlotPoolTestPeer::ownsMainCache(t.pool->slots()));
  EXPECT_NE(tls_slot_cache.stream, nullptr);
  EXPECT_TRUE(agree());
  for (StreamIndex index : {5, 7, 5, 0}) {
    t.pool->slots().exchangeCurrentIndex(index);
    EXPECT_TRUE(agree()) << "exchanging in " << index;
    EXPECT_EQ(t.pool->slots().currentIndex(), index);
    EXPECT_EQ(t.pool->currentStream().index, index);
    EXPECT_TRUE(agree()) << "after exchanging in " << index;
  }
  PoolUnderTest other(options({}, /*main_thread=*/true));
  EXPECT_EQ(other.pool->currentStream().index, 0);
  EXPECT_TRUE(StreamSlotPoolTestPeer::ownsMainCache(other.pool->slots()));
  EXPECT_EQ(
      StreamSlotPoolTestPeer::mainCopy(t.pool->slots()), &t.pool->stream(0));
  EXPECT_EQ(t.pool->currentStream().index, 0);
}

// The owner gives the copy up as it exits; a later thread that gets the same
// thread pointer (glibc reuses a joined thread's stack and thread block) must
// not read the exited owner's stream.
TEST(StreamPoolTest, AThreadReusingAnExitedOwnersThreadPointerLeases) {
  std::atomic<bool> next_is_main{true};
  at::mps::StreamPoolOptions o = options();
  o.is_main_thread = [&] { return next_is_main.load(); };
  PoolUnderTest t(std::move(o));
  const uintptr_t owner = onThread([&] {
    EXPECT_EQ(t.pool->currentStream().index, 0);
    EXPECT_TRUE(StreamSlotPoolTestPeer::ownsMainCache(t.pool->slots()));
    return at::mps::detail::threadWord();
  });
  EXPECT_EQ(StreamSlotPoolTestPeer::mainOwner(t.pool->slots()), 0u);
  next_is_main = false;
  int reused = 0;
  for (int i = 0; i < 20; ++i) {
    const auto [word, index] = onThread([&] {
      return std::make_pair(
          at::mps::detail::threadWord(), t.pool->currentStream().index);
    });
    reused += word == owner;
    EXPECT_EQ(index, 1) << "thread " << i << (word == owner ? " (reused)" : "");
  }
  EXPECT_GT(reused, 0) << "no thread reused the owner's thread pointer";
}

// ------------------------------------------------------------ exhaustion

TEST(StreamPoolTest, ShareModeHandsOutWorkerStreamsRoundRobin) {
  PoolUnderTest t(options({ExhaustionPolicy::kShare, {}}));
  LeaseHolders holders(*t.pool, kWorkerStreams);
  std::set<StreamIndex> shared;
  for (int i = 0; i < 3; ++i) {
    onThread([&] {
      const StreamIndex idx = t.pool->slots().currentIndex();
      EXPECT_GE(idx, 1);
      EXPECT_LT(idx, kStreamsPerPool);
      EXPECT_FALSE(t.pool->slots().currentThreadHoldsLease());
      shared.insert(idx);
      return 0;
    });
  }
  EXPECT_EQ(shared.size(), 3u);
  EXPECT_EQ(
      StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), kWorkerStreams);
}

TEST(StreamPoolTest, ThrowModeRaisesErrorNamingTheVariable) {
  PoolUnderTest t(options({ExhaustionPolicy::kThrow, {}}));
  LeaseHolders holders(*t.pool, kWorkerStreams);
  EXPECT_TORCH_ERROR(
      onThread([&] { return t.pool->slots().currentIndex(); }),
      "MPS_STREAM_POOL_WAIT_TIMEOUT_MS=0");
}

TEST(StreamPoolTest, WaitModeBlocksUntilASlotIsReleased) {
  PoolUnderTest t(options({ExhaustionPolicy::kWait, {}}));
  LeaseHolders holders(*t.pool, kWorkerStreams);
  std::atomic<StreamIndex> got{-1};
  std::thread waiter([&] { got = t.pool->slots().currentIndex(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(got.load(), -1);
  holders.release();
  waiter.join();
  EXPECT_GE(got.load(), 1);
}

TEST(StreamPoolTest, TimeoutModeRaisesAfterTheTimeout) {
  PoolUnderTest t(
      options({ExhaustionPolicy::kWaitTimeout, std::chrono::milliseconds(40)}));
  LeaseHolders holders(*t.pool, kWorkerStreams);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TORCH_ERROR(
      onThread([&] { return t.pool->slots().currentIndex(); }),
      "MPS_STREAM_POOL_WAIT_TIMEOUT_MS=40 ms");
  EXPECT_GE(
      std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
}

TEST(StreamPoolTest, TimeoutModeSucceedsWhenReleasedInTime) {
  PoolUnderTest t(
      options({ExhaustionPolicy::kWaitTimeout, std::chrono::seconds(10)}));
  LeaseHolders holders(*t.pool, kWorkerStreams);
  std::atomic<StreamIndex> got{-1};
  std::thread waiter([&] { got = t.pool->slots().currentIndex(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  holders.release();
  waiter.join();
  EXPECT_GE(got.load(), 1);
}

// A guard on a thread without a stream, with every worker slot leased:
// its query of the current slot and its exchanges neither wait nor throw,
// whatever the policy (Note [MPS stream queries]), and ops inside run on the
// exchanged-in slot. The thread's first op after the guard applies the
// policy: kThrow raises, kWait takes the next released slot as a lease.
TEST(StreamPoolTest, AGuardOnAnExhaustedPoolNeitherWaitsNorThrows) {
  for (const ExhaustionPolicy policy :
       {ExhaustionPolicy::kThrow, ExhaustionPolicy::kWait}) {
    PoolUnderTest t(options({policy, {}}));
    auto holders = std::make_unique<LeaseHolders>(*t.pool, kWorkerStreams);
    std::thread releaser;
    onThread([&] {
      const StreamIndex saved = t.pool->slots().currentIndex(/*query=*/true);
      EXPECT_GE(saved, 1);
      EXPECT_EQ(t.pool->slots().exchangeCurrentIndex(5), saved);
      EXPECT_EQ(t.pool->slots().currentIndex(), 5);
      EXPECT_EQ(t.pool->slots().exchangeCurrentIndex(saved), 5);
      EXPECT_EQ(t.pool->slots().currentIndex(/*query=*/true), saved);
      EXPECT_FALSE(t.pool->slots().currentThreadHoldsLease());
      EXPECT_EQ(
          StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), kWorkerStreams);
      if (policy == ExhaustionPolicy::kThrow) {
        EXPECT_TORCH_ERROR(
            t.pool->slots().currentIndex(),
            "MPS_STREAM_POOL_WAIT_TIMEOUT_MS=0");
      } else {
        releaser = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          holders->release();
        });
        EXPECT_GE(t.pool->slots().currentIndex(), 1);
        EXPECT_TRUE(t.pool->slots().currentThreadHoldsLease());
      }
      return 0;
    });
    if (releaser.joinable()) {
      releaser.join();
    }
  }
}

// With a free slot a query leases it, as a first op would, and with none
// under kShare it shares one: either way the thread's ops stay on it.
TEST(StreamPoolTest, AQueryBindsTheSlotTheThreadsOpsThenUse) {
  PoolUnderTest t(options({ExhaustionPolicy::kShare, {}}));
  onThread([&] {
    const StreamIndex queried = t.pool->slots().currentIndex(/*query=*/true);
    EXPECT_TRUE(t.pool->slots().currentThreadHoldsLease());
    EXPECT_EQ(t.pool->slots().currentIndex(), queried);
    return 0;
  });
  LeaseHolders holders(*t.pool, kWorkerStreams);
  onThread([&] {
    const StreamIndex queried = t.pool->slots().currentIndex(/*query=*/true);
    EXPECT_FALSE(t.pool->slots().currentThreadHoldsLease());
    EXPECT_EQ(t.pool->slots().currentIndex(), queried);
    return 0;
  });
}

// ------------------------------------------------------------ env parsing

TEST(ExhaustionConfigTest, ParsesEveryAcceptedForm) {
  EXPECT_EQ(
      at::mps::parseExhaustionConfig(nullptr).policy, ExhaustionPolicy::kShare);
  EXPECT_EQ(
      at::mps::parseExhaustionConfig("").policy, ExhaustionPolicy::kShare);
  EXPECT_EQ(
      at::mps::parseExhaustionConfig("0").policy, ExhaustionPolicy::kThrow);
  EXPECT_EQ(
      at::mps::parseExhaustionConfig("-1").policy, ExhaustionPolicy::kWait);
  const auto cfg = at::mps::parseExhaustionConfig("250");
  EXPECT_EQ(cfg.policy, ExhaustionPolicy::kWaitTimeout);
  EXPECT_EQ(cfg.timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(
      at::mps::parseExhaustionConfig("2147483647").timeout.count(), 2147483647);
}

TEST(ExhaustionConfigTest, RejectsMalformedValuesWithAClearError) {
  for (const char* bad :
       {"abc",
        "12ms",
        " 5",
        "5 ",
        "+5",
        "-",
        "-2",
        "1.5",
        "0x10",
        "2147483648",
        "99999999999999999999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_TORCH_ERROR(
        at::mps::parseExhaustionConfig(bad),
        std::string("MPS_STREAM_POOL_WAIT_TIMEOUT_MS='") + bad +
            "' is not valid. Accepted values");
  }
}

TEST(ExhaustionConfigTest, OptionsReadTheEnvironment) {
  {
    harness::ScopedEnv env(at::mps::kWaitTimeoutEnvVar, "-1");
    EXPECT_EQ(
        at::mps::StreamPoolOptions::fromEnvironment().exhaustion.policy,
        ExhaustionPolicy::kWait);
  }
  {
    harness::ScopedEnv env(at::mps::kWaitTimeoutEnvVar, nullptr);
    EXPECT_EQ(
        at::mps::StreamPoolOptions::fromEnvironment().exhaustion.policy,
        ExhaustionPolicy::kShare);
  }
  harness::ScopedEnv env(at::mps::kWaitTimeoutEnvVar, "soon");
  EXPECT_TORCH_ERROR(
      at::mps::StreamPoolOptions::fromEnvironment(),
      "MPS_STREAM_POOL_WAIT_TIMEOUT_MS='soon'");
}

// ------------------------------------------------------------ explicit API

TEST(StreamPoolTest, GetStreamFromPoolIsRoundRobinOverWorkers) {
  PoolUnderTest t;
  std::map<StreamIndex, int> hits;
  for (int i = 0; i < 2 * kWorkerStreams; ++i) {
    hits[t.pool->stream(t.pool->slots().nextPoolIndex()).index]++;
  }
  EXPECT_EQ(hits.size(), static_cast<size_t>(kWorkerStreams));
  EXPECT_EQ(hits.count(0), 0u);
  for (auto& [index, n] : hits) {
    EXPECT_EQ(n, 2) << "slot " << index;
  }
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), 0);
}

TEST(StreamPoolTest, GuardSetsAndRestoresTheCurrentStream) {
  PoolUnderTest t(options({}, /*main_thread=*/true));
  {
    sim::CurrentStreamGuard<Pool> g1(*t.pool, 5);
    EXPECT_EQ(g1.previous(), 0);
    EXPECT_EQ(t.pool->currentStream().index, 5);
    {
      sim::CurrentStreamGuard<Pool> g2(*t.pool, 9);
      EXPECT_EQ(t.pool->slots().currentIndex(), 9);
      // Another thread's current stream is not affected.
      EXPECT_NE(onThread([&] { return t.pool->slots().currentIndex(); }), 9);
    }
    EXPECT_EQ(t.pool->slots().currentIndex(), 5);
  }
  EXPECT_EQ(t.pool->slots().currentIndex(), 0);
}

// A stream guard restores the stream it replaced; releasing the lease under
// it would put the thread back on a slot it no longer owns.
TEST(StreamPoolTest, ReleasingTheLeaseInsideAStreamGuardIsRefused) {
  PoolUnderTest t;
  onThread([&] {
    const StreamIndex mine = t.pool->slots().currentIndex();
    {
      sim::CurrentStreamGuard<Pool> g(*t.pool, mine == 7 ? 8 : 7);
      EXPECT_TORCH_ERROR(
          t.pool->slots().releaseCurrentThreadSlot(),
          "release_current_thread_slot(): the calling thread is inside "
          "a stream context");
      EXPECT_TRUE(t.pool->slots().currentThreadHoldsLease());
    }
    EXPECT_EQ(t.pool->slots().currentIndex(), mine);
    t.pool->slots().releaseCurrentThreadSlot();
    EXPECT_FALSE(t.pool->slots().currentThreadHoldsLease());
    return 0;
  });
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), 0);
}

// A guard on the thread's own stream restores it on exit: giving the lease
// back inside would make that restore bind a slot the thread no longer owns,
// or lease one from the guard's destructor.
TEST(StreamPoolTest, ReleaseInsideAGuardOnTheOwnStreamIsRefused) {
  PoolUnderTest t(options({ExhaustionPolicy::kThrow, {}}));
  onThread([&] {
    const StreamIndex mine = t.pool->slots().currentIndex();
    {
      sim::CurrentStreamGuard<Pool> g(*t.pool, mine);
      EXPECT_TORCH_ERROR(
          t.pool->slots().releaseCurrentThreadSlot(),
          "inside a stream context");
    }
    EXPECT_EQ(t.pool->slots().currentIndex(), mine);
    t.pool->slots().releaseCurrentThreadSlot();
    EXPECT_FALSE(t.pool->slots().currentThreadHoldsLease());
    return 0;
  });
}

// set_stream() to another stream is an open displacement too, until the
// thread sets its own stream back.
TEST(StreamPoolTest, ReleaseAfterSetStreamElsewhereWaitsForTheWayBack) {
  PoolUnderTest t;
  onThread([&] {
    const StreamIndex mine = t.pool->slots().currentIndex();
    const StreamIndex other = mine == 7 ? 8 : 7;
    EXPECT_EQ(t.pool->slots().exchangeCurrentIndex(other), mine);
    EXPECT_TORCH_ERROR(
        t.pool->slots().releaseCurrentThreadSlot(), "set_stream");
    EXPECT_EQ(t.pool->slots().exchangeCurrentIndex(mine), other);
    t.pool->slots().releaseCurrentThreadSlot();
    EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), 0);
    return 0;
  });
}

// A guard opened after a release leases on entry, as any first use does, and
// restores that lease on exit.
TEST(StreamPoolTest, GuardAfterAReleaseLeasesOnEntryNotOnExit) {
  PoolUnderTest t;
  onThread([&] {
    const StreamIndex first = t.pool->slots().currentIndex();
    t.pool->slots().releaseCurrentThreadSlot();
    StreamIndex leased = -1;
    {
      sim::CurrentStreamGuard<Pool> g(*t.pool, first == 7 ? 8 : 7);
      leased = g.previous();
      EXPECT_TRUE(t.pool->slots().currentThreadHoldsLease());
    }
    EXPECT_EQ(t.pool->slots().currentIndex(), leased);
    EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(t.pool->slots()), 1);
    return 0;
  });
}

TEST(StreamIdTest, MapsStreamIdsToSlotIndices) {
  for (StreamIndex i = 0; i < kStreamsPerPool; ++i) {
    EXPECT_EQ(at::mps::streamIndexFromId(i), i);
  }
  EXPECT_TORCH_ERROR(at::mps::streamIndexFromId(32), "stream_id=32");
  EXPECT_TORCH_ERROR(at::mps::streamIndexFromId(-3), "stream_id=-3");
}

TEST(StreamPoolTest, SynchronizeAllCoversEveryCreatedStreamOnly) {
  PoolUnderTest t;
  t.pool->stream(0);
  t.pool->stream(4);
  t.pool->stream(31);
  std::set<StreamIndex> synced;
  EXPECT_CALL(*t.backend, synchronize(_))
      .Times(3)
      .WillRepeatedly(Invoke([&](FakeStream& s) { synced.insert(s.index); }));
  t.pool->synchronizeAll();
  EXPECT_EQ(synced, (std::set<StreamIndex>{0, 4, 31}));
}

// ------------------------------------------------------------ fork, shutdown

// Runs fn in a forked child; returns the child's exit status.
template <typename Fn>
int inForkedChild(Fn fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    _exit(fn());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

TEST(StreamPoolTest, ChildAfterForkGetsAClearError) {
  PoolUnderTest t(options({}, /*main_thread=*/true));
  EXPECT_EQ(t.pool->currentStream().index, 0); // cached, main thread's too
  const int child = inForkedChild([&] {
    int failures = 0;
    for (auto fn : std::vector<std::function<void()>>{
             [&] { t.pool->slots().currentIndex(); },
             [&] { t.pool->currentStream(); },
             [&] { t.pool->stream(1); },
             [&] { t.pool->stream(t.pool->slots().nextPoolIndex()); },
             [&] { t.pool->synchronizeAll(); },
             [&] { t.pool->slots().releaseCurrentThreadSlot(); }}) {
      try {
        fn();
      } catch (const c10::Error& e) {
        failures += std::string(e.what()).find("fork()") != std::string::npos;
      }
    }
    // A pool made in the child itself works.
    PoolUnderTest fresh(options({}, /*main_thread=*/true));
    return failures == 6 && fresh.pool->slots().currentIndex() == 0 ? 0 : 1;
  });
  EXPECT_EQ(child, 0);
  EXPECT_EQ(t.pool->slots().currentIndex(), 0); // the parent is unaffected
}

// A leasing thread that forks and then ends the child with exit() runs its
// thread_local destructors there: they must not hand the lease back to the
// parent's pool (the release hook would drive the parent's streams).
TEST(StreamPoolTest, ThreadExitInAForkChildLeavesTheParentPoolAlone) {
  PoolUnderTest t;
  const pid_t parent = getpid();
  ON_CALL(*t.backend, onLeaseReleased(_))
      .WillByDefault(Invoke([parent](FakeStream&) {
        if (getpid() != parent) {
          _exit(42);
        }
      }));
  const int child = onThread([&] {
    EXPECT_GT(t.pool->currentStream().index, 0); // holds a lease
    const pid_t pid = fork();
    if (pid == 0) {
      // The child never destroys the parent's pool or its mock.
      ::testing::Mock::AllowLeak(t.backend);
      // std::exit runs this thread's thread_local destructors first, then the
      // atexit functions, latest first: this one ends the child there, before
      // static destructors and LeakSanitizer's exit check, which belong to
      // the parent (the child lacks the parent's other threads and their
      // roots).
      std::atexit([] { _exit(0); });
      std::exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  });
  EXPECT_EQ(child, 0);
}

TEST(StreamPoolDeathTest, ProcessExitWhileThreadsHoldLeasesIsClean) {
  EXPECT_EXIT(
      {
        // Leaked like the production pool; threads still hold leases.
        PoolUnderTest leaked;
        ::testing::Mock::AllowLeak(leaked.backend); // leaked with the pool
        auto* pool = leaked.pool.release();
        harness::Latch leased(8);
        for (int i = 0; i < 8; ++i) {
          std::thread([&] {
            pool->slots().currentIndex();
            leased.countDown();
            std::this_thread::sleep_for(std::chrono::hours(1));
          }).detach();
        }
        leased.wait();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      "");
}

TEST(StreamPoolTest, ThreadExitingAfterPoolDestructionDoesNotTouchIt) {
  harness::Latch leased(1), pool_gone(1);
  auto t = std::make_unique<PoolUnderTest>();
  std::thread th([&] {
    t->pool->slots().currentIndex();
    leased.countDown();
    pool_gone.wait();
  });
  leased.wait();
  t.reset();
  pool_gone.countDown();
  th.join(); // the lease's pool is gone: returning it must be a no-op
  PoolUnderTest again; // a new pool, possibly at the same address
  EXPECT_EQ(onThread([&] { return again.pool->slots().currentIndex(); }), 1);
}

// ------------------------------------------------------------ with the sim

class SimPoolTest : public harness::SimTest {
 protected:
  void releaseResources() override {
    pool_.reset();
  }
  std::unique_ptr<sim::SimStreamPool> pool_;
};

TEST_F(SimPoolTest, QueueCreationFaultSurfacesAndIsRetried) {
  pool_ = std::make_unique<sim::SimStreamPool>(
      std::make_unique<sim::SimStreamBackend>(device()), options());
  device().failNextQueueCreations(1);
  EXPECT_TORCH_ERROR(pool_->stream(2), "slot 2 failed");
  EXPECT_EQ(pool_->stream(2).index(), 2);
}

TEST_F(SimPoolTest, ReleasedLeaseCommitsWorkLeftOnTheStream) {
  pool_ = std::make_unique<sim::SimStreamPool>(
      std::make_unique<sim::SimStreamBackend>(device()), options());
  auto buf = device().newBuffer(1);
  onThread([&] {
    pool_->currentStream().encodeKernel(
        {{{buf, sim::Access::kWrite}}, [buf] { buf->write(0, 5); }},
        at::mps::SyncType::NONE);
    return 0;
  }); // thread exit returns the lease, which commits
  device().waitIdle();
  EXPECT_EQ(buf->read(0), 5);
  EXPECT_EQ(pool_->stream(1).lifecycle().lastCommitPoint(), 1u);
}

} // namespace
