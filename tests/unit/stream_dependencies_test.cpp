// Cross-stream dependency tracking: values a single queue would give, on
// many queues, with no explicit synchronisation by the "user".

#include "dependency_fixture.h"

#include <atomic>
#include <future>
#include <random>
#include <set>
#include <thread>

namespace {

using at::mps::Access;
using at::mps::BufferUses;
using at::mps::SyncType;
using at::mps::UseSite;
using harness::DependencyTest;
using harness::Tensor;
using ::testing::HasSubstr;

TEST_F(DependencyTest, SameStreamUsesNeedNoWaits) {
  makeStreams(1);
  auto a = tensor(1), b = tensor();
  for (int i = 0; i < 100; ++i) {
    op(stream(0), {a.get()}, b.get(), i);
    op(stream(0), {b.get()}, a.get(), i);
  }
  EXPECT_EQ(gpuWaits() + cpuWaits(), 0u);
  stream(0).synchronize(SyncType::COMMIT_AND_WAIT);
}

TEST_F(DependencyTest, ReadAfterWriteOnAnotherStreamWaitsOnTheGpu) {
  makeStreams(2);
  auto x = tensor(5), y = tensor();
  stream(0).queue().pause(); // the producer's work is slow to run
  op(stream(0), {}, x.get(), 42, SyncType::COMMIT);
  const auto start = std::chrono::steady_clock::now();
  op(stream(1), {x.get()}, y.get(), 1, SyncType::COMMIT);
  EXPECT_LT(
      std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  EXPECT_EQ(gpuWaits(), 1u);
  stream(0).queue().resume();
  stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(y->buf->read(0), 1 * 1000003 + 42);
}

// The negative control: the same program without tracking reads a stale
// value, which the value check (and the sim's hazard detector) catches.
TEST_F(DependencyTest, WithoutTrackingTheConsumerReadsAStaleValue) {
  makeStreams(2);
  auto x = tensor(5), y = tensor();
  stream(0).queue().pause();
  op(stream(0),
     {},
     x.get(),
     42,
     SyncType::COMMIT,
     UseSite::kBeforeEncoding,
     /*track=*/false);
  op(stream(1),
     {x.get()},
     y.get(),
     1,
     SyncType::COMMIT_AND_WAIT,
     UseSite::kBeforeEncoding,
     /*track=*/false);
  EXPECT_EQ(y->buf->read(0), 1 * 1000003 + 5); // read before the write
  stream(0).queue().resume();
}

TEST_F(DependencyTest, WriteAfterReadWaitsForTheReaders) {
  makeStreams(2);
  auto x = tensor(7), y = tensor();
  stream(0).queue().pause();
  op(stream(0), {x.get()}, y.get(), 3, SyncType::COMMIT); // reads x
  op(stream(1), {}, x.get(), 100, SyncType::COMMIT); // overwrites x
  stream(0).queue().resume();
  stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
  stream(0).synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(y->buf->read(0), 3 * 1000003 + 7); // saw the old value
  EXPECT_EQ(x->buf->read(0), 100);
}

TEST_F(DependencyTest, IdleProducerWithUncommittedWorkIsFlushed) {
  makeStreams(2);
  auto x = tensor(), y = tensor();
  op(stream(0), {}, x.get(), 9, SyncType::NONE); // left in an open window
  EXPECT_TRUE(stream(0).lifecycle().hasUncommittedWork());
  op(stream(1), {x.get()}, y.get(), 2, SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(y->buf->read(0), 2 * 1000003 + 9);
}

TEST_F(DependencyTest, BusyProducerCommitsWhenItLeavesItsSerialSection) {
  makeStreams(2);
  auto x = tensor(), y = tensor();
  // The producer's GPU stays busy, so its work cannot complete before the
  // consumer decides how to wait for it.
  stream(0).queue().pause();
  op(stream(0), {}, x.get(), 9, SyncType::NONE);
  harness::Latch entered(1), leave(1);
  std::thread busy([&] {
    stream(0).serial([&](sim::Lifecycle&) {
      entered.countDown();
      leave.wait();
    });
  });
  entered.wait();
  // The producer's mark is not committed: the consumer asks for a commit and
  // waits for it before encoding a GPU wait (Progress rule 1).
  auto consumer_done = std::async(std::launch::async, [&] {
    op(stream(1), {x.get()}, y.get(), 2, SyncType::COMMIT);
  });
  waitForFlushRequest(stream(0));
  EXPECT_EQ(
      consumer_done.wait_for(std::chrono::milliseconds(20)),
      std::future_status::timeout); // producer still holds its window
  EXPECT_EQ(stream(0).flushRequests(), 1u);
  leave.countDown();
  busy.join();
  consumer_done.get();
  EXPECT_EQ(commitWaits(), 1u);
  EXPECT_EQ(gpuWaits(), 1u);
  stream(0).queue().resume();
  stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(y->buf->read(0), 2 * 1000003 + 9);
}

TEST_F(DependencyTest, HostReadWaitsForTheProducerOnly) {
  makeStreams(3);
  auto x = tensor(), unrelated = tensor();
  stream(2).queue().pause(); // unrelated work that never finishes here
  op(stream(2), {}, unrelated.get(), 1, SyncType::COMMIT);
  op(stream(0), {}, x.get(), 77, SyncType::NONE);
  EXPECT_EQ(hostRead(stream(1), *x), 77);
  // Stream 1 waited for stream 0's commit; whether a GPU wait followed depends
  // on how soon stream 0's work completed.
  EXPECT_EQ(commitWaits(), 1u);
  stream(2).queue().resume();
}

TEST_F(DependencyTest, InPassReadWaitsOnTheCpu) {
  makeStreams(2);
  auto x = tensor(), y = tensor();
  op(stream(0), {}, x.get(), 11, SyncType::NONE);
  op(stream(1),
     {x.get()},
     y.get(),
     4,
     SyncType::COMMIT_AND_WAIT,
     UseSite::kInPass);
  EXPECT_EQ(cpuWaits(), 1u);
  EXPECT_EQ(y->buf->read(0), 4 * 1000003 + 11);
}

// Two streams consuming each other's outputs in a cycle, concurrently.
TEST_F(DependencyTest, StreamsConsumingEachOthersOutputsInACycleFinish) {
  makeStreams(2);
  auto x = tensor(1), y = tensor(2);
  const int rounds = 200 * harness::stressScale();
  auto worker = [&](int me, Tensor* mine, Tensor* theirs) {
    for (int i = 0; i < rounds; ++i) {
      op(stream(me),
         {theirs},
         mine,
         i,
         i % 5 == 0 ? SyncType::COMMIT : SyncType::NONE);
    }
    stream(me).synchronize(SyncType::COMMIT_AND_WAIT);
  };
  auto a = std::async(std::launch::async, worker, 0, x.get(), y.get());
  auto b = std::async(std::launch::async, worker, 1, y.get(), x.get());
  ASSERT_EQ(a.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_EQ(b.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  a.get();
  b.get();
}

TEST_F(DependencyTest, InPassCycleIsReportedInsteadOfHanging) {
  makeStreams(2);
  auto x = tensor(), y = tensor();
  harness::Latch both_open(2);
  std::atomic<int> cycle_errors{0};
  auto worker = [&](int me, Tensor* mine, Tensor* theirs) {
    stream(me).serial([&](sim::Lifecycle& lc) {
      auto enc = lc.commandEncoder();
      use(stream(me), mine->uses, Access::kWrite, UseSite::kInPass);
      enc->dispatch({{{mine->buf, sim::Access::kWrite}}, nullptr});
      both_open.arriveAndWait(); // both passes hold their writes open
      try {
        use(stream(me), theirs->uses, Access::kRead, UseSite::kInPass);
      } catch (const c10::Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("neither can go first"));
        cycle_errors++;
      }
    });
  };
  auto a = std::async(std::launch::async, worker, 0, x.get(), y.get());
  auto b = std::async(std::launch::async, worker, 1, y.get(), x.get());
  ASSERT_EQ(a.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_EQ(b.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_GE(cycle_errors.load(), 1);
}

// In-place ops bind their output twice in one pass, as the output and as an
// input. Stream 1's use of that buffer, recorded between the two bindings,
// waits for stream 0's whole pass, so the second binding needs nothing from
// it: waiting would be a cycle that the serial order does not have. Stream
// 0's first kernel writes 1, its second one reads and, if `second` is a
// write, writes 2; `stream1_op` runs while stream 0's pass is open.
class InPassRebindingTest : public DependencyTest {
 protected:
  void SetUp() override {
    DependencyTest::SetUp();
    x_ = tensor(0);
  }
  void rebindAfterStream1(
      const std::function<void()>& stream1_op,
      Access second = Access::kWrite) {
    makeStreams(2);
    std::future<void> other;
    stream(0).serial([&](sim::Lifecycle& lc) {
      sim::EncoderPtr enc = lc.commandEncoder();
      use(stream(0), x_->uses, Access::kWrite, UseSite::kInPass);
      enc->dispatch({{{x_->buf, sim::Access::kWrite}}, [b = x_->buf] {
                       b->write(0, 1);
                     }});
      other = std::async(std::launch::async, stream1_op);
      waitForFlushRequest(stream(0)); // stream 1 recorded its use
      use(stream(0), x_->uses, second, UseSite::kInPass);
      const bool write = second == Access::kWrite;
      enc->dispatch(
          {{{x_->buf, write ? sim::Access::kWrite : sim::Access::kRead}},
           [this, b = x_->buf, write] {
             seen_ = b->read(0);
             if (write) {
               b->write(0, 2);
             }
           }});
    });
    ASSERT_EQ(other.wait_for(harness::kDeadline), std::future_status::ready);
    other.get();
    stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
    EXPECT_EQ(cpuWaits() + commitWaits(), 1u) << "only stream 1 waits";
  }
  std::unique_ptr<Tensor> x_;
  std::atomic<int64_t> seen_{-1}; // what the second kernel read
};

TEST_F(InPassRebindingTest, AfterAnotherStreamsWriteNeedsNoWait) {
  rebindAfterStream1([&] {
    op(stream(1), {}, x_.get(), 5, SyncType::COMMIT, UseSite::kInPass);
  });
  EXPECT_EQ(x_->buf->read(0), combine({}, 5)); // written after both kernels
}

TEST_F(InPassRebindingTest, ReadAfterAnotherStreamsWriteNeedsNoWait) {
  rebindAfterStream1(
      [&] {
        op(stream(1), {}, x_.get(), 5, SyncType::COMMIT, UseSite::kInPass);
      },
      Access::kRead);
  EXPECT_EQ(seen_.load(), 1); // its own pass's write, not stream 1's
  EXPECT_EQ(x_->buf->read(0), combine({}, 5));
}

TEST_F(InPassRebindingTest, AfterAnotherStreamsReadNeedsNoWait) {
  auto y = tensor(0);
  rebindAfterStream1(
      [&] { op(stream(1), {x_.get()}, y.get(), 5, SyncType::COMMIT); });
  EXPECT_EQ(y->buf->read(0), combine({x_->buf}, 5)); // read 2, after both
  EXPECT_EQ(x_->buf->read(0), 2);
}

TEST(BufferUseTableTest, OneRecordPerKeyPerTable) {
  at::mps::BufferUseTable a, b;
  int x = 0, y = 0;
  EXPECT_EQ(&a.get(&x), &a.get(&x));
  EXPECT_NE(&a.get(&x), &a.get(&y));
  EXPECT_NE(&a.get(&x), &b.get(&x)); // tables never share cached entries
  std::vector<BufferUses*> seen(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] { seen[t] = &a.get(&y); });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_THAT(seen, ::testing::Each(&a.get(&y)));
}

// A buffer handed out again keeps its record: a new user on another stream
// waits for the previous life's work (see Note [MPS buffer use table]).
TEST_F(DependencyTest, ReusedBufferKeepsThePreviousLifesUses) {
  makeStreams(2);
  at::mps::BufferUseTable table;
  auto buf = device().newBuffer(1);
  stream(0).queue().pause();
  stream(0).serial([&](sim::Lifecycle& lc) {
    use(stream(0),
        table.get(buf.get()),
        Access::kWrite,
        UseSite::kBeforeEncoding);
    lc.commandEncoder()->dispatch(
        {{{buf, sim::Access::kWrite}}, [buf] { buf->write(0, 1); }});
    lc.synchronize(SyncType::COMMIT);
  });
  // "Freed" and reused by a tensor on stream 1: same buffer, same record.
  std::atomic<int64_t> seen{-1};
  stream(1).serial([&](sim::Lifecycle& lc) {
    use(stream(1),
        table.get(buf.get()),
        Access::kWrite,
        UseSite::kBeforeEncoding);
    lc.commandEncoder()->dispatch({{{buf, sim::Access::kWrite}}, [buf, &seen] {
                                     seen = buf->read(0);
                                     buf->write(0, 2);
                                   }});
    lc.synchronize(SyncType::COMMIT);
  });
  stream(0).queue().resume();
  stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(seen.load(), 1); // ran after the previous life's write
  EXPECT_EQ(buf->read(0), 2);
}

// The per-kernel hook skips only a use its pass already recorded: a write
// after the same pass read the buffer is recorded, so a reader on another
// stream waits for it.
TEST_F(DependencyTest, InPassHookRecordsAWriteAfterItsPassReadTheBuffer) {
  makeStreams(2);
  at::mps::BufferUseTable table;
  auto x = tensor(0);
  const void* key = x->buf.get();
  stream(0).queue().pause();
  writeInPassOnStream0(*x, 5, SyncType::COMMIT, [&] {
    tracker_->useInPass(stream(0), table, key, Access::kRead);
    tracker_->useInPass(stream(0), table, key, Access::kWrite);
  });
  EXPECT_EQ(readOnStream1(*x, table.get(key)), 5);
  EXPECT_EQ(gpuWaits(), 1u);
}

// The hook's fast path matches the open pass only: a write in a later pass
// of the same stream is recorded at that pass's mark, so a reader on another
// stream waits for it and not just for the completed earlier pass.
TEST_F(DependencyTest, InPassHookRecordsAWriteOfALaterPassAtItsMark) {
  makeStreams(2);
  at::mps::BufferUseTable table;
  auto x = tensor(0);
  const void* key = x->buf.get();
  const auto hook = [&] {
    tracker_->useInPass(stream(0), table, key, Access::kWrite);
  };
  writeInPassOnStream0(*x, 1, SyncType::COMMIT_AND_WAIT, hook);
  stream(0).queue().pause();
  writeInPassOnStream0(*x, 5, SyncType::COMMIT, hook);
  EXPECT_EQ(readOnStream1(*x, table.get(key)), 5);
  EXPECT_EQ(gpuWaits(), 1u);
}

// The same for a read: the fast path matches a read to the open pass only,
// so a read in a later pass is recorded at that pass's mark and a writer on
// another stream waits for it.
TEST_F(DependencyTest, InPassHookRecordsAReadOfALaterPassAtItsMark) {
  makeStreams(2);
  at::mps::BufferUseTable table;
  auto x = tensor(3);
  const void* key = x->buf.get();
  std::atomic<int64_t> seen{-1};
  const auto readOnStream0 = [&](SyncType sync) {
    stream(0).serial([&](sim::Lifecycle& lc) {
      sim::EncoderPtr enc = lc.commandEncoder();
      tracker_->useInPass(stream(0), table, key, Access::kRead);
      enc->dispatch({{{x->buf, sim::Access::kRead}}, [b = x->buf, &seen] {
                       seen = b->read(0);
                     }});
      lc.synchronize(sync);
    });
  };
  readOnStream0(SyncType::COMMIT_AND_WAIT);
  stream(0).queue().pause();
  readOnStream0(SyncType::COMMIT);
  stream(1).serial([&](sim::Lifecycle& lc) {
    use(stream(1), table.get(key), Access::kWrite, UseSite::kBeforeEncoding);
    lc.commandEncoder()->dispatch(
        {{{x->buf, sim::Access::kWrite}}, [b = x->buf] { b->write(0, 7); }});
    lc.synchronize(SyncType::COMMIT);
  });
  stream(0).queue().resume();
  stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(seen.load(), 3); // the second read ran before the write
  EXPECT_EQ(x->buf->read(0), 7);
  EXPECT_EQ(gpuWaits(), 1u);
}

// The hook's lookup cache is tagged by table: a use through a second table,
// same stream, same buffer, same pass, is recorded in that table.
TEST_F(DependencyTest, InPassHookKeepsTheUsesOfTwoTablesApart) {
  makeStreams(2);
  at::mps::BufferUseTable first, second;
  auto x = tensor(0);
  const void* key = x->buf.get();
  stream(0).queue().pause();
  writeInPassOnStream0(*x, 5, SyncType::COMMIT, [&] {
    tracker_->useInPass(stream(0), first, key, Access::kWrite);
    tracker_->useInPass(stream(0), second, key, Access::kWrite);
  });
  EXPECT_EQ(readOnStream1(*x, second.get(key)), 5);
  EXPECT_EQ(gpuWaits(), 1u);
}

// v2.9.1 binds some buffers outside the serial section (copy_from_mps_), so
// the hook's per-stream cache has users besides the thread in the section,
// here with keys that evict each other's entries. Under TSan this fails if
// an entry is read or written non-atomically; everywhere, the pass's write
// must still be recorded.
TEST_F(DependencyTest, InPassHookOutsideTheSerialSectionSharesTheCache) {
  makeStreams(2);
  at::mps::BufferUseTable table;
  std::vector<std::unique_ptr<Tensor>> xs;
  for (int i = 0; i < 256; ++i) {
    xs.push_back(tensor(0));
  }
  const int rounds = 50 * harness::stressScale();
  const auto hookHalf = [&](int first) {
    for (int r = 0; r < rounds; ++r) {
      for (int i = first; i < first + 128; ++i) {
        tracker_->useInPass(stream(0), table, xs[i]->buf.get(), Access::kWrite);
      }
    }
  };
  stream(0).queue().pause();
  std::thread outside;
  writeInPassOnStream0(*xs[0], 5, SyncType::COMMIT, [&] {
    outside = std::thread(hookHalf, 128);
    hookHalf(0);
    outside.join();
  });
  EXPECT_EQ(readOnStream1(*xs[0], table.get(xs[0]->buf.get())), 5);
  EXPECT_EQ(gpuWaits(), 1u);
  std::set<const at::mps::BufferUses*> records; // one per key
  for (const auto& x : xs) {
    records.insert(&table.get(x->buf.get()));
  }
  EXPECT_EQ(records.size(), 256u);
}

// Randomized producer/consumer graphs: 16 threads, each on its own stream,
// issue ops over shared tensors in a global issue order (taken before the
// stream's serial section, as independent threads would interleave); the
// GPU runs them concurrently with random latency. Final values must equal a
// serial replay of the issue order.
TEST_F(DependencyTest, RandomGraphsOverSixteenStreamsMatchASerialReplay) {
  constexpr int kThreads = 16;
  constexpr int kTensors = 24;
  makeStreams(kThreads);
  std::vector<std::unique_ptr<Tensor>> ts;
  std::vector<int64_t> reference(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    ts.push_back(tensor(i));
    reference[i] = i;
  }
  std::mutex issue;
  const int ops_per_thread = 150 * harness::stressScale();
  auto worker = [&](int me) {
    std::mt19937 rng(1000 + me);
    for (int i = 0; i < ops_per_thread; ++i) {
      const int out = rng() % kTensors;
      std::vector<int> ins;
      for (int k = rng() % 3; k >= 0; --k) {
        ins.push_back(rng() % kTensors);
      }
      const auto site =
          rng() % 8 == 0 ? UseSite::kInPass : UseSite::kBeforeEncoding;
      const SyncType sync = rng() % 4 == 0 ? SyncType::COMMIT : SyncType::NONE;
      const int64_t salt = me * 100000 + i;
      std::lock_guard<std::mutex> lock(issue);
      std::vector<Tensor*> in_ptrs;
      uint64_t v = static_cast<uint64_t>(salt);
      for (int k : ins) {
        in_ptrs.push_back(ts[k].get());
        v = mix(v, reference[k]);
      }
      reference[out] = static_cast<int64_t>(v);
      op(stream(me), in_ptrs, ts[out].get(), salt, sync, site);
      if (rng() % 50 == 0) {
        const int probe = rng() % kTensors;
        EXPECT_EQ(hostRead(stream(me), *ts[probe]), reference[probe]);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(worker, t);
  }
  for (auto& th : threads) {
    th.join();
  }
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_EQ(hostRead(stream(0), *ts[i]), reference[i]) << "tensor " << i;
  }
  EXPECT_GT(gpuWaits(), 0u);
}

} // namespace
