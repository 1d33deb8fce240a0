// Stress: many threads mixing every pool operation over the simulated GPU.
// Iteration counts scale with MPS_STRESS_SCALE (1 on CI).

#include "SimStream.h"
#include "harness.h"
#include "stream_pool_peer.h"

#include <atomic>
#include <random>
#include <thread>

namespace {

using at::mps::ExhaustionConfig;
using at::mps::ExhaustionPolicy;
using at::mps::kWorkerStreams;
using at::mps::StreamIndex;
using at::mps::StreamSlotPoolTestPeer;
using at::mps::SyncType;

at::mps::StreamPoolOptions workerThreads(ExhaustionConfig cfg = {}) {
  at::mps::StreamPoolOptions o;
  o.exhaustion = cfg;
  o.is_main_thread = [] { return false; };
  return o;
}

class PoolStressTest : public harness::SimTest {
 protected:
  PoolStressTest() : harness::SimTest(latencyConfig()) {}
  static sim::Config latencyConfig() {
    sim::Config c;
    c.seed = 20261121;
    c.min_latency = std::chrono::microseconds(0);
    c.max_latency = std::chrono::microseconds(40);
    c.reorder_completions = 0.1;
    return c;
  }
  void makePool(ExhaustionConfig cfg = {}) {
    pool_ = std::make_unique<sim::SimStreamPool>(
        std::make_unique<sim::SimStreamBackend>(device()), workerThreads(cfg));
  }
  void releaseResources() override {
    pool_.reset();
  }
  std::unique_ptr<sim::SimStreamPool> pool_;
};

// 64 threads x N iterations: first use, release, share mode, guards,
// getStreamFromPool, encoding with every sync type, synchronizeAll. Each
// thread writes its own buffer; the values and the kernel count prove that no
// work was lost or reordered within a stream.
TEST_F(PoolStressTest, SixtyFourThreadsMixingEveryOperation) {
  makePool();
  constexpr int kThreads = 64;
  const int iters = 400 * harness::stressScale();
  std::atomic<int64_t> kernels{0};
  std::vector<sim::BufferPtr> bufs;
  for (int t = 0; t < kThreads; ++t) {
    bufs.push_back(device().newBuffer(1));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      auto& buf = bufs[t];
      for (int i = 1; i <= iters; ++i) {
        const int op = rng() % 16;
        // Writes are ordered on whatever stream this thread uses now; a
        // COMMIT_AND_WAIT before a stream switch keeps order across them.
        auto kernel =
            sim::Kernel{{{buf, sim::Access::kWrite}}, [&kernels, buf, i] {
                          buf->write(0, i);
                          kernels++;
                        }};
        if (op < 8) {
          pool_->currentStream().encodeKernel(
              std::move(kernel),
              op < 6 ? SyncType::COMMIT_ADAPTIVE : SyncType::COMMIT_AND_WAIT);
        } else if (op < 10) {
          pool_->currentStream().encodeKernel(
              std::move(kernel), SyncType::COMMIT_AND_WAIT);
          pool_->slots().releaseCurrentThreadSlot();
        } else if (op < 12) {
          pool_->currentStream().encodeKernel(
              std::move(kernel), SyncType::COMMIT_AND_WAIT);
          sim::CurrentStreamGuard<sim::SimStreamPool> g(
              *pool_, static_cast<StreamIndex>(rng() % 32));
          pool_->currentStream().encodeKernel(
              {{}, [&kernels] { kernels++; }}, SyncType::COMMIT);
        } else if (op < 14) {
          // Another stream: finish this thread's earlier writes first.
          pool_->currentStream().synchronize(SyncType::COMMIT_AND_WAIT);
          pool_->stream(pool_->slots().nextPoolIndex())
              .encodeKernel(std::move(kernel), SyncType::COMMIT_AND_WAIT);
        } else if (op < 15) {
          pool_->currentStream().encodeKernel(
              std::move(kernel), SyncType::COMMIT);
          pool_->synchronizeAll();
        } else {
          pool_->currentStream().encodeKernel(
              std::move(kernel), SyncType::COMMIT_AND_WAIT);
          pool_->stream(0).encodeKernel(
              {{}, [&kernels] { kernels++; }}, SyncType::COMMIT);
        }
      }
      pool_->currentStream().synchronize(SyncType::COMMIT_AND_WAIT);
      EXPECT_EQ(buf->read(0), iters) << "thread " << t;
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  pool_->synchronizeAll();
  device().waitIdle();
  EXPECT_GE(kernels.load(), static_cast<int64_t>(kThreads) * iters);
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(pool_->slots()), 0);
}

TEST_F(PoolStressTest, HundredThousandShortLivedThreadsLeakNoSlot) {
  makePool({ExhaustionPolicy::kWait, {}});
  const int total = 100000;
  constexpr int kWave = 16;
  std::atomic<int> leased_ok{0};
  for (int done = 0; done < total; done += kWave) {
    std::vector<std::thread> wave;
    for (int i = 0; i < kWave; ++i) {
      wave.emplace_back([&] {
        const StreamIndex idx = pool_->slots().currentIndex();
        leased_ok += idx >= 1 && pool_->slots().currentThreadHoldsLease();
      });
    }
    for (auto& th : wave) {
      th.join();
    }
  }
  EXPECT_EQ(leased_ok.load(), total);
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(pool_->slots()), 0);
}

// Note [MPS main thread lookup]: waves of short-lived threads, a quarter of
// them main threads of the pool, which claim the pool's copy of their cache
// in turn and give it up as they exit, while the others lease and reuse the
// exited threads' thread pointers. Every thread checks the stream it gets,
// inside a guard and after it; TSan checks each hand-over.
TEST_F(PoolStressTest, MainThreadsHandTheCopyOverAsTheyExit) {
  static thread_local bool is_main = false;
  at::mps::StreamPoolOptions o = workerThreads();
  o.is_main_thread = [] { return is_main; };
  pool_ = std::make_unique<sim::SimStreamPool>(
      std::make_unique<sim::SimStreamBackend>(device()), std::move(o));
  const int total = 20000 * harness::stressScale();
  constexpr int kWave = 16;
  std::atomic<int> right{0}, claimed{0};
  for (int done = 0; done < total; done += kWave) {
    std::vector<std::thread> wave;
    for (int i = 0; i < kWave; ++i) {
      wave.emplace_back([&, i] {
        is_main = i % 4 == 0;
        const StreamIndex own = pool_->slots().currentIndex();
        claimed += StreamSlotPoolTestPeer::ownsMainCache(pool_->slots());
        const StreamIndex other = 1 + (done + i) % kWorkerStreams;
        bool ok = (is_main ? own == 0 : own >= 1) &&
            pool_->currentStream().index() == own;
        {
          sim::CurrentStreamGuard<sim::SimStreamPool> g(*pool_, other);
          ok = ok && pool_->currentStream().index() == other;
        }
        right += ok && pool_->currentStream().index() == own;
      });
    }
    for (auto& th : wave) {
      th.join();
    }
  }
  EXPECT_EQ(right.load(), total);
  EXPECT_GT(claimed.load(), 0);
  EXPECT_EQ(StreamSlotPoolTestPeer::mainOwner(pool_->slots()), 0u);
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(pool_->slots()), 0);
}

// 4x oversubscription (124 threads for 31 worker slots) under each policy.
class ExhaustionStressTest : public PoolStressTest {
 protected:
  static constexpr int kThreads = 4 * kWorkerStreams;

  struct Outcome {
    int ok = 0;
    int errors = 0;
    std::string first_error;
    int guard_errors = 0; // guard_first: guards that threw
    int ok_without_lease = 0; // successes that ran on a shared stream
  };

  // Every thread takes a stream, encodes and waits, holds it for `hold`,
  // then exits (returning any lease). With `guard_first`, its first call is
  // a guard onto a worker stream with one kernel there, as the autograd
  // engine's thread makes: the guard's saved stream is a query.
  Outcome run(
      std::chrono::milliseconds hold,
      int rounds = 3,
      bool guard_first = false) {
    Outcome out;
    std::mutex mu;
    harness::Latch start(kThreads);
    std::vector<std::thread> threads;
    auto buf = device().newBuffer(1);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arriveAndWait();
        if (guard_first) {
          try {
            sim::CurrentStreamGuard<sim::SimStreamPool> g(
                *pool_, static_cast<StreamIndex>(1 + t % kWorkerStreams));
            pool_->currentStream().encodeKernel(
                {{{buf, sim::Access::kRead}}, nullptr},
                SyncType::COMMIT_AND_WAIT);
          } catch (const c10::Error&) {
            std::lock_guard<std::mutex> lock(mu);
            out.guard_errors++;
          }
        }
        try {
          for (int r = 0; r < rounds; ++r) {
            pool_->currentStream().encodeKernel(
                {{{buf, sim::Access::kRead}}, nullptr},
                SyncType::COMMIT_AND_WAIT);
          }
          const bool leased = pool_->slots().currentThreadHoldsLease();
          std::this_thread::sleep_for(hold);
          std::lock_guard<std::mutex> lock(mu);
          out.ok++;
          out.ok_without_lease += leased ? 0 : 1;
        } catch (const c10::Error& e) {
          std::lock_guard<std::mutex> lock(mu);
          if (out.errors++ == 0) {
            out.first_error = e.what();
          }
        }
      });
    }
    for (auto& th : threads) {
      th.join();
    }
    EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(pool_->slots()), 0);
    return out;
  }
};

TEST_F(ExhaustionStressTest, ShareModeNeverFails) {
  makePool({ExhaustionPolicy::kShare, {}});
  const Outcome o = run(std::chrono::milliseconds(20));
  EXPECT_EQ(o.ok, kThreads);
  EXPECT_EQ(o.errors, 0);
}

TEST_F(ExhaustionStressTest, ThrowModeFailsExactlyTheThreadsBeyondThePool) {
  makePool({ExhaustionPolicy::kThrow, {}});
  // Holding for long enough that every thread asks while 31 are held.
  const Outcome o = run(std::chrono::milliseconds(300), 1);
  EXPECT_GE(o.ok, kWorkerStreams);
  EXPECT_EQ(o.ok + o.errors, kThreads);
  EXPECT_GT(o.errors, 0);
  EXPECT_THAT(o.first_error, ::testing::HasSubstr("=0 ms"));
}

TEST_F(ExhaustionStressTest, WaitModeServesEveryThreadEventually) {
  makePool({ExhaustionPolicy::kWait, {}});
  const Outcome o = run(std::chrono::milliseconds(5));
  EXPECT_EQ(o.ok, kThreads);
}

// Guards before a thread's first op, on a pool that runs out: no guard
// waits or throws (Note [MPS stream queries]), and the ops after them still
// apply the policy: under kThrow exactly the threads beyond the pool fail,
// under kWait every thread is served, each on a lease of its own.
TEST_F(
    ExhaustionStressTest,
    GuardsBeforeTheFirstOpNeverFailAndOpsKeepThePolicy) {
  makePool({ExhaustionPolicy::kThrow, {}});
  Outcome o = run(std::chrono::milliseconds(300), 1, /*guard_first=*/true);
  EXPECT_EQ(o.guard_errors, 0);
  EXPECT_GE(o.ok, kWorkerStreams);
  EXPECT_GT(o.errors, 0);
  EXPECT_EQ(o.ok + o.errors, kThreads);
  EXPECT_EQ(o.ok_without_lease, 0);
  makePool({ExhaustionPolicy::kWait, {}});
  o = run(std::chrono::milliseconds(5), 3, /*guard_first=*/true);
  EXPECT_EQ(o.guard_errors, 0);
  EXPECT_EQ(o.ok, kThreads);
  EXPECT_EQ(o.ok_without_lease, 0);
}

TEST_F(ExhaustionStressTest, TimeoutModeWaitsOrFailsWithTheTimeoutError) {
  makePool({ExhaustionPolicy::kWaitTimeout, std::chrono::seconds(30)});
  EXPECT_EQ(run(std::chrono::milliseconds(5)).ok, kThreads);
  makePool({ExhaustionPolicy::kWaitTimeout, std::chrono::milliseconds(10)});
  const Outcome o = run(std::chrono::milliseconds(300), 1);
  EXPECT_GT(o.errors, 0);
  EXPECT_EQ(o.ok + o.errors, kThreads);
  EXPECT_THAT(o.first_error, ::testing::HasSubstr("within"));
}

TEST_F(PoolStressTest, InjectedFaultsSurfaceAndThePoolRecovers) {
  makePool();
  constexpr int kThreads = 32;
  std::atomic<int> creation_errors{0}, gpu_errors{0}, ok{0};
  device().failNextQueueCreations(10);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto buf = device().newBuffer(1);
      for (int i = 0; i < 20; ++i) {
        if (t == 0 && i == 10) {
          device().failNextCommits(5, "invalidResource");
        }
        try {
          pool_->currentStream().encodeKernel(
              {{{buf, sim::Access::kWrite}}, [buf, i] { buf->write(0, i); }},
              SyncType::COMMIT_AND_WAIT);
          ok++;
        } catch (const c10::Error& e) {
          const std::string what = e.what();
          if (what.find("failed (no command queue)") != std::string::npos) {
            creation_errors++;
          } else if (what.find("invalidResource") != std::string::npos) {
            gpu_errors++;
          } else {
            ADD_FAILURE() << what;
          }
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_EQ(creation_errors.load(), 10);
  EXPECT_GE(gpu_errors.load(), 1);
  EXPECT_EQ(ok + creation_errors + gpu_errors, kThreads * 20);
  EXPECT_EQ(StreamSlotPoolTestPeer::leasedSlots(pool_->slots()), 0);
}

} // namespace
