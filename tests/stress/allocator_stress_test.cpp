// The allocator core under load on simulated streams with random GPU
// latency: every handout is checked by the hazard detector, frees happen on
// other threads, blocks are used across streams with recordStream, and
// emptyCache, garbage collection and out-of-memory retries run while other
// threads allocate. At the end the statistics must balance exactly and no
// device memory may be left behind.

#include "allocator_fixture.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

using at::mps::StreamIndex;
using at::mps::SyncType;
using harness::kLarge;
using harness::kScalar;
using harness::kSmall;

constexpr int kThreads = 8;
constexpr size_t kMiB = 1024 * 1024;

sim::Config stressConfig() {
  sim::Config c;
  c.seed = 20260;
  c.min_latency = std::chrono::microseconds(0);
  c.max_latency = std::chrono::microseconds(40);
  c.reorder_completions = 0.05;
  return c;
}

class AllocatorStressTest : public harness::AllocatorSimTest {
 protected:
  AllocatorStressTest() : AllocatorSimTest(stressConfig()) {}

  // One worker per thread, each on its own leased stream. Blocks can be
  // posted to another worker, which frees them (cross-thread frees).
  struct Mailbox {
    std::mutex mu;
    std::vector<sim::BufferPtr> blocks;
  };

  struct Options {
    int64_t ops = 0; // mallocs + frees per thread
    int max_live = 8;
    int large_percent = 20;
    int scalar_percent = 10;
    int kernel_percent = 30; // mallocs followed by a kernel on the stream
    int cross_percent = 10; // ... of those on another stream instead
    int post_percent = 20; // frees done by another thread
    bool tolerate_oom = false;
  };

  // waitStream(waiter, signaler): work encoded on `waiter` from now on
  // starts after all work encoded on `signaler` so far (an event signal on
  // one queue and a GPU-side wait on the other).
  class StreamEvents {
   public:
    explicit StreamEvents(sim::Device& device) {
      for (auto& e : events_) {
        e = device.newSharedEvent();
      }
    }
    void waitStream(sim::SimStream& waiter, sim::SimStream& signaler) {
      if (&waiter == &signaler) {
        return;
      }
      const sim::SharedEventPtr& event = events_[signaler.index()];
      uint64_t value = 0;
      signaler.serial([&](sim::Lifecycle& lc) {
        lc.endKernelCoalescing();
        value = ++values_[signaler.index()];
        lc.commandBuffer()->encodeSignal(event, value);
        lc.synchronize(SyncType::COMMIT);
      });
      waiter.serial([&](sim::Lifecycle& lc) {
        lc.endKernelCoalescing();
        lc.commandBuffer()->encodeWait(event, value);
      });
    }

   private:
    std::array<sim::SharedEventPtr, at::mps::kStreamsPerPool> events_;
    // Each written only inside its stream's serial section.
    std::array<uint64_t, at::mps::kStreamsPerPool> values_{};
  };

  // Which stream cache each freed block went to, as the rule says (rule 1 of
  // Note [MPS allocator cross-stream reuse]): a handout on another stream of
  // a block cached there is a steal.
  class CacheLedger {
   public:
    // Returns whether the block was stolen from another stream's cache.
    bool handout(const sim::BufferPtr& b, StreamIndex stream, int pool) {
      std::lock_guard<std::mutex> lock(mu_);
      Life& life = lives_[b->id()];
      const bool stolen = life.cached_on >= 0 && life.cached_on != stream;
      life = {stream, pool != kScalar, -1};
      return stolen;
    }
    void recordStream(const sim::BufferPtr& b, StreamIndex stream) {
      std::lock_guard<std::mutex> lock(mu_);
      Life& life = lives_[b->id()];
      life.cacheable = life.cacheable && stream == life.stream;
    }
    // Called before the free, after which the block may be handed out.
    void free(const sim::BufferPtr& b) {
      std::lock_guard<std::mutex> lock(mu_);
      Life& life = lives_[b->id()];
      life.cached_on = life.cacheable ? life.stream : -1;
    }

   private:
    struct Life {
      StreamIndex stream = -1;
      bool cacheable = false;
      StreamIndex cached_on = -1;
    };
    std::mutex mu_;
    std::unordered_map<uint64_t, Life> lives_;
  };

  struct Totals {
    std::atomic<uint64_t> mallocs{0};
    std::atomic<uint64_t> frees{0};
    std::atomic<uint64_t> ooms{0};
    std::atomic<uint64_t> steals{0};
  };

  void runWorkers(const Options& o, Totals& totals) {
    std::array<std::atomic<StreamIndex>, kThreads> streams{};
    std::array<Mailbox, kThreads> mailboxes;
    StreamEvents events(device());
    CacheLedger ledger;
    harness::Latch leased(kThreads);
    harness::Latch stopped(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          sim::SimStream& own = pool_->currentStream();
          streams[t] = own.index();
          leased.arriveAndWait();
          std::mt19937 rng(1000 + t);
          const auto pct = [&] { return static_cast<int>(rng() % 100); };
          std::vector<sim::BufferPtr> live;
          int64_t ops = 0;
          const auto freeOne = [&](const sim::BufferPtr& b) {
            ledger.free(b);
            release(b);
            ++ops;
            totals.frees.fetch_add(1);
          };
          const auto drain = [&] {
            std::vector<sim::BufferPtr> inbox;
            {
              std::lock_guard<std::mutex> lock(mailboxes[t].mu);
              inbox.swap(mailboxes[t].blocks);
            }
            for (auto& b : inbox) {
              freeOne(b);
            }
          };
          while (ops < o.ops) {
            drain();
            const bool grow = live.empty() ||
                (static_cast<int>(live.size()) < o.max_live && pct() < 55);
            if (grow) {
              const int kind = pct();
              int pool = kSmall;
              size_t size = size_t{256} << (rng() % 9); // 256 B .. 64 KiB
              if (kind < o.scalar_percent) {
                pool = kScalar;
                size = 8;
              } else if (kind < o.scalar_percent + o.large_percent) {
                pool = kLarge;
                size = kMiB << (rng() % 3); // 1 .. 4 MiB
              }
              sim::BufferPtr b;
              try {
                b = alloc(own.index(), size, pool);
              } catch (const c10::Error& e) {
                if (!o.tolerate_oom ||
                    std::string(e.what()).find("out of memory") ==
                        std::string::npos) {
                  throw;
                }
                totals.ooms.fetch_add(1);
                ++ops;
                continue;
              }
              ++ops;
              totals.mallocs.fetch_add(1);
              if (ledger.handout(b, own.index(), pool)) {
                totals.steals.fetch_add(1);
              }
              if (pool == kScalar) {
                b->write(0, ops); // the CPU fills it, as for MPS scalars
              }
              // A block is used either on its own stream or handed off to
              // another one, which first waits for the allocation stream, as
              // CUDA code calls wait_stream() before using a tensor on a side
              // stream (see Note [MPS allocator cross-stream reuse]).
              if (pct() < o.kernel_percent) {
                if (pct() < o.cross_percent) {
                  const StreamIndex other = streams[rng() % kThreads];
                  sim::SimStream& side = stream(other);
                  events.waitStream(side, own);
                  core_->recordStream(b.get(), other);
                  ledger.recordStream(b, other);
                  side.encodeKernel(
                      write(b, ops),
                      pct() < 50 ? SyncType::COMMIT : SyncType::NONE);
                } else {
                  own.encodeKernel(write(b, ops), SyncType::NONE);
                }
              }
              live.push_back(std::move(b));
            } else {
              const size_t i = rng() % live.size();
              sim::BufferPtr b = std::move(live[i]);
              live[i] = std::move(live.back());
              live.pop_back();
              if (pct() < o.post_percent) {
                const int to = static_cast<int>(rng() % kThreads);
                std::lock_guard<std::mutex> lock(mailboxes[to].mu);
                mailboxes[to].blocks.push_back(std::move(b));
              } else {
                freeOne(b);
              }
            }
            const int sync = pct();
            if (sync < 6) {
              own.synchronize(SyncType::COMMIT);
            } else if (sync == 6 && rng() % 64 == 0) {
              own.synchronize(SyncType::COMMIT_AND_WAIT);
            }
          }
          for (auto& b : live) {
            freeOne(b);
          }
          stopped.arriveAndWait(); // nobody posts from here on
          drain();
          own.synchronize(SyncType::COMMIT);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "worker " << t << ": " << e.what();
          std::abort(); // the other workers wait for this one at a latch
        }
      });
    }
    for (auto& th : threads) {
      th.join();
    }
  }

  // After quiesce(): nothing handed out, nothing pending, and every byte the
  // allocator reserves is in one of its caches and on the device.
  void expectBalanced() {
    const auto s = core_->stats();
    EXPECT_EQ(s.allocated_bytes, 0);
    EXPECT_EQ(s.pending_bytes, 0)
        << "every fence is resolved by a completion handler";
    EXPECT_EQ(timelines_->handlersRegistered(), timelines_->handlersRun());
    const auto c = harness::census(*core_);
    EXPECT_EQ(c.pending_bytes, 0);
    EXPECT_EQ(c.stream_cached_bytes + c.free_bytes, s.reserved_bytes);
    EXPECT_EQ(static_cast<int64_t>(backend_->used()), s.reserved_bytes);
    EXPECT_EQ(static_cast<int64_t>(backend_->live()), c.blocks);

    core_->emptyCache();
    EXPECT_EQ(core_->stats().reserved_bytes, 0);
    EXPECT_EQ(backend_->used(), 0u) << "device memory leaked";
    EXPECT_EQ(backend_->live(), 0u) << "device buffers leaked";
  }
};

TEST_F(AllocatorStressTest, MillionRandomOpsAcrossEightStreamsHaveNoHazards) {
  build();
  Options o;
  o.ops = 1000000 * harness::stressScale() / kThreads;
  Totals totals;
  runWorkers(o, totals);
  quiesce();
  EXPECT_EQ(device().hazards().count(), 0u);
  EXPECT_EQ(totals.mallocs.load(), totals.frees.load());
  EXPECT_GE(
      totals.mallocs.load() + totals.frees.load(),
      1000000u * harness::stressScale());
  EXPECT_GT(totals.steals.load(), 0u);
  EXPECT_GT(timelines_->handlersRun(), 0u);
  expectBalanced();
}

TEST_F(
    AllocatorStressTest,
    EmptyCacheAndGarbageCollectionRunWhileOthersAllocate) {
  build();
  core_->setLowWatermark(24 * kMiB); // the workers need more than that
  Options o;
  o.ops = 100000 * harness::stressScale() / kThreads;
  o.large_percent = 50;
  Totals totals;
  // Workers release device memory only by collecting garbage (no OOM here).
  static thread_local bool sweeping = false;
  std::atomic<uint64_t> collected{0};
  backend_->on_release = [&] {
    if (!sweeping) {
      collected.fetch_add(1);
    }
  };
  std::atomic<bool> done{false};
  std::atomic<int> sweeps{0};
  std::thread sweeper([&] {
    sweeping = true;
    while (!done.load()) {
      core_->emptyCache();
      core_->resolvePending();
      sweeps.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  runWorkers(o, totals);
  done = true;
  sweeper.join();
  quiesce();
  EXPECT_GT(sweeps.load(), 0);
  backend_->on_release = nullptr;
  EXPECT_GT(collected.load(), 0u);
  expectBalanced();
}

TEST_F(AllocatorStressTest, OutOfMemoryRetriesWhileOthersAllocate) {
  build(/*capacity=*/40 * kMiB); // workers may want up to 8 x 8 x 4 MiB
  Options o;
  o.ops = 40000 * harness::stressScale() / kThreads;
  o.large_percent = 60;
  o.tolerate_oom = true;
  Totals totals;
  std::atomic<uint64_t> retries{0};
  backend_->on_allocation_failed = [&] { retries.fetch_add(1); };
  runWorkers(o, totals);
  quiesce();
  backend_->on_allocation_failed = nullptr;
  EXPECT_GT(retries.load(), totals.ooms.load()) << "some retries found memory";
  EXPECT_LE(backend_->used(), 40 * kMiB);
  expectBalanced();
}

} // namespace
