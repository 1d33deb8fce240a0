// MPSEvent and MPSEventPool (the ops' events, torch.mps.Event through the
// MPS hooks): reuse after release, ids, timing.

#include "GlueTest.h"

#include <ATen/detail/MPSHooksInterface.h>
#include <ATen/mps/MPSEvent.h>
#include <c10/core/StreamGuard.h>

#include <atomic>
#include <set>

namespace {

using at::mps::MPSStream;
using glue::GlueTest;

// A pooled event goes back to the pool on release and comes out again,
// bound to the new stream. Once re-recorded behind slow work it is not
// signalled until that work ran (v2.9.1 reset the value to 0, which Metal
// ignores, so a reused event looked signalled at once).
TEST_F(GlueTest, PooledEventIsReusedAfterReleaseAndIsNotSignalledEarly) {
  auto pool = at::mps::getMPSEventPool();
  MPSStream* a = at::mps::getMPSStream(1);
  MPSStream* b = at::mps::getMPSStream(2);
  at::mps::MPSEventPtr first = pool->acquireEvent(false, a);
  const id_t first_id = first->getID();
  first->record(true, false);
  EXPECT_TRUE(first->synchronize() || first->query());
  first.reset();

  at::mps::MPSEventPtr reused = pool->acquireEvent(false, b);
  EXPECT_EQ(reused->getID(), first_id);
  c10::DataPtr data = glue::allocated(64);
  std::atomic<bool> release{false};
  std::atomic<bool>* release_p = &release;
  {
    c10::StreamGuard g(b->unwrap());
    glue::encodeKernel({glue::bufferOf(data)}, [release_p] {
      while (!release_p->load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
  }
  reused->record(true, false);
  EXPECT_FALSE(reused->query());
  release.store(true);
  reused->synchronize();
  EXPECT_TRUE(reused->query());
}

// torch.mps.Event through the hooks: acquire, record, wait, synchronize,
// query, elapsed time, release; a released id is refused by name. An event's
// time is taken when Metal's listener delivers its notification, which a
// loaded machine can delay past the start of the work after it (12 ms of a
// 20 ms kernel were measured so): the kernel is encoded once the start's
// time exists (the elapsed time of an event to itself waits for it), and
// then lies wholly between the two times.
TEST_F(GlueTest, HooksEventApiAndReleasedIdsAreRefused) {
  const auto& hooks = at::detail::getMPSHooks();
  const uint32_t start = hooks.acquireEvent(true);
  const uint32_t end = hooks.acquireEvent(true);
  EXPECT_NE(start, end);
  c10::DataPtr data = glue::allocated(64);
  hooks.recordEvent(start);
  EXPECT_EQ(hooks.elapsedTimeOfEvents(start, start), 0.0);
  glue::encodeKernel({glue::bufferOf(data)}, [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  hooks.recordEvent(end);
  hooks.waitForEvent(end);
  hooks.synchronizeEvent(end);
  EXPECT_TRUE(hooks.queryEvent(end));
  EXPECT_GE(hooks.elapsedTimeOfEvents(start, end), 20.0);
  hooks.releaseEvent(start);
  hooks.releaseEvent(end);
  try {
    hooks.recordEvent(end);
    FAIL() << "recordEvent accepted released event id " << end;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(end)), std::string::npos) << e.what();
  }
  const uint32_t next = hooks.acquireEvent(false);
  EXPECT_NE(next, start);
  EXPECT_NE(next, end);
  hooks.releaseEvent(next);
}

// Many threads acquire, record, synchronize and release pooled events at
// once: every event handed out is held by one thread only.
TEST_F(GlueTest, PooledEventsFromManyThreadsAreNeverSharedWhileHeld) {
  constexpr int kThreads = 12;
  auto pool = at::mps::getMPSEventPool();
  std::mutex mu;
  std::set<id_t> held;
  std::atomic<int> shared{0};
  glue::onThreads(kThreads, [&](int) {
    c10::DataPtr data = glue::allocated(64);
    for (int i = 0; i < 40; ++i) {
      at::mps::MPSEventPtr event = pool->acquireEvent(i % 2 == 0, nullptr);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!held.insert(event->getID()).second) {
          shared.fetch_add(1);
        }
      }
      glue::encodeIncrement(glue::bufferOf(data));
      event->record(true, false);
      event->synchronize();
      EXPECT_TRUE(event->query());
      {
        std::lock_guard<std::mutex> lock(mu);
        held.erase(event->getID());
      }
    }
  });
  EXPECT_EQ(shared.load(), 0);
}

} // namespace
