// Deterministic interleavings of the cross-stream dependency protocol that
// used to deadlock, driven through the tracker's fast-path hook (see
// support/fast_path_hook.h) and explicit hand-offs between threads.

#include "dependency_fixture.h"
#include "fast_path_hook.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace harness {
namespace {

// The thread that set `armed` stops once, after the fast path published the
// first buffer of an op, until the test releases it.
thread_local bool armed = false;
Latch* paused = nullptr;
Latch* resume = nullptr;

} // namespace

void fastPathPublished(size_t buffer_index) {
  if (armed && buffer_index == 0) {
    armed = false;
    paused->countDown();
    resume->wait();
  }
}

namespace {

using at::mps::Access;
using at::mps::SyncType;
using at::mps::UseSite;
using harness::kDeadline;
using ::testing::HasSubstr;

class DependencyRaceTest : public DependencyTest {
 protected:
  DependencyRaceTest() : DependencyTest(config()) {}
  static sim::Config config() {
    sim::Config c = latency();
    // A full queue blocks the encoding thread, as Metal's does.
    c.max_inflight = 2;
    // A GPU wait that can never be satisfied fails within seconds.
    c.event_wait_timeout = std::chrono::milliseconds(5000);
    return c;
  }
  void SetUp() override {
    DependencyTest::SetUp();
    paused = &paused_;
    resume = &resume_;
  }
  void TearDown() override {
    resume_.countDown(); // never leave a stopped thread behind
    DependencyTest::TearDown();
  }
  static int64_t apply(std::initializer_list<int64_t> ins, int64_t salt) {
    uint64_t v = static_cast<uint64_t>(salt);
    for (int64_t in : ins) {
      v = mix(v, in);
    }
    return static_cast<int64_t>(v);
  }

  Latch paused_{1};
  Latch resume_{1};
};

// Stream A owns x and y (fast path) and starts an op reading y and writing x.
// It stops after publishing its read of y; stream B then takes both buffers
// over with an op reading x and writing y, so B is ordered after A's op on y.
// A's op can no longer publish x and records both buffers again, after B.
// Were it to keep the mark B saw, each stream would wait for the other on
// the GPU. The serial order is A1, B, A2.
TEST_F(
    DependencyRaceTest,
    TakeoverInsideAFastPathOpDoesNotMakeStreamsWaitForEachOther) {
  makeStreams(2);
  auto x = tensor(1), y = tensor(2);
  op(stream(0), {y.get()}, x.get(), 10); // A1: both buffers become A's
  auto a = std::async(std::launch::async, [&] {
    armed = true;
    op(stream(0), {y.get()}, x.get(), 20); // A2, stopped inside the fast path
    stream(0).synchronize(SyncType::COMMIT_AND_WAIT);
  });
  paused_.wait();
  auto b = std::async(std::launch::async, [&] {
    op(stream(1), {x.get()}, y.get(), 30, SyncType::COMMIT); // B
    stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
  });
  waitForFlushRequest(stream(0));
  resume_.countDown();
  ASSERT_EQ(a.wait_for(kDeadline), std::future_status::ready);
  ASSERT_EQ(b.wait_for(kDeadline), std::future_status::ready);
  a.get();
  b.get();
  const int64_t x1 = apply({2}, 10);
  const int64_t y1 = apply({x1}, 30);
  EXPECT_EQ(y->buf->read(0), y1);
  EXPECT_EQ(x->buf->read(0), apply({y1}, 20));
}

// Stream A encodes a write of x and then, in the same serial section, holds
// an encoder for a kernel that reads y. Stream B's op, between the two,
// reads x and writes y. A cannot commit x's mark while it holds its encoder,
// and its kernel needs B's write: no order exists, and both threads must
// learn it at once instead of waiting for each other.
TEST_F(DependencyRaceTest, InPassWaitThatNeedsItsOwnUncommittedWorkIsReported) {
  makeStreams(2);
  auto x = tensor(1), y = tensor(2);
  Latch a_wrote(1), b_recorded(1);
  std::atomic<int> cycle_errors{0};
  auto count_cycle = [&](const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("neither can go first"));
    cycle_errors++;
  };
  auto a = std::async(std::launch::async, [&] {
    stream(0).serial([&](sim::Lifecycle& lc) {
      op(stream(0), {}, x.get(), 5); // A1 writes x, left uncommitted
      a_wrote.countDown();
      b_recorded.wait();
      auto enc = lc.commandEncoder(); // A2 holds its encoder
      try {
        use(stream(0), y->uses, Access::kRead, UseSite::kInPass);
      } catch (const c10::Error& e) {
        count_cycle(e);
      }
      lc.endKernelCoalescing();
    });
    stream(0).synchronize(SyncType::COMMIT_AND_WAIT);
  });
  a_wrote.wait();
  auto b = std::async(std::launch::async, [&] {
    try {
      op(stream(1), {x.get()}, y.get(), 6, SyncType::COMMIT);
    } catch (const c10::Error& e) {
      count_cycle(e);
    }
    stream(1).synchronize(SyncType::COMMIT_AND_WAIT);
  });
  waitForFlushRequest(stream(0));
  b_recorded.countDown();
  ASSERT_EQ(a.wait_for(kDeadline), std::future_status::ready);
  ASSERT_EQ(b.wait_for(kDeadline), std::future_status::ready);
  a.get();
  b.get();
  EXPECT_GE(cycle_errors.load(), 1);
}

} // namespace
} // namespace harness
