// c10::impl::getDeviceGuardImpl(kMPS): what torch.Stream, torch.Event,
// torch.accelerator and Tensor.record_stream reach.

#include "GlueTest.h"

#include <ATen/mps/MPSStream.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <set>

namespace {

using at::mps::MPSStream;
using glue::GlueTest;

const c10::impl::DeviceGuardImplInterface* guard() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::MPS);
}

const c10::Device kMPS(c10::DeviceType::MPS, 0);

TEST_F(GlueTest, GuardIsRegisteredForMPSAndReportsTheCurrentStream) {
  EXPECT_EQ(guard()->type(), c10::DeviceType::MPS);
  EXPECT_EQ(guard()->deviceCount(), 1);
  EXPECT_EQ(guard()->getStream(kMPS), at::mps::getCurrentMPSStream()->unwrap());
  EXPECT_EQ(guard()->getDefaultStream(kMPS).id(), 0);
  std::thread([] {
    const c10::Stream s = guard()->getStream(kMPS);
    EXPECT_NE(s.id(), 0);
    EXPECT_EQ(s, at::mps::getCurrentMPSStream()->unwrap());
  }).join();
}

TEST_F(GlueTest, ExchangeStreamMakesTheStreamCurrentAndReturnsThePrevious) {
  const c10::Stream worker = at::mps::getMPSStream(7)->unwrap();
  const c10::Stream previous = guard()->exchangeStream(worker);
  EXPECT_EQ(previous.id(), 0);
  EXPECT_EQ(at::mps::getCurrentMPSStream(), at::mps::getMPSStream(7));
  c10::DataPtr data = glue::allocated(64);
  glue::encodeIncrement(glue::bufferOf(data));
  EXPECT_FALSE(guard()->queryStream(worker) && at::mps::getMPSStream(7)->pendingCommitPoint() == 0);
  EXPECT_EQ(guard()->exchangeStream(previous), worker);
  EXPECT_EQ(at::mps::getCurrentMPSStream(), at::mps::getDefaultMPSStream());
  guard()->synchronizeStream(worker);
  EXPECT_TRUE(guard()->queryStream(worker));
  EXPECT_EQ(glue::words(glue::bufferOf(data))[0], 1);
}

// c10::StreamGuard (torch.mps.stream(...)) from many threads at once.
TEST_F(GlueTest, StreamGuardsOnManyThreadsRestoreEachThreadsStream) {
  glue::onThreads(12, [](int t) {
    MPSStream* own = at::mps::getCurrentMPSStream();
    const c10::Stream target = at::mps::getMPSStream(1 + (t * 5) % (at::mps::kStreamsPerPool - 1))->unwrap();
    for (int i = 0; i < 20; ++i) {
      c10::StreamGuard g(target);
      EXPECT_EQ(at::mps::getCurrentMPSStream()->unwrap(), target);
      glue::encodeIncrement(glue::bufferOf(glue::allocated(64)));
    }
    EXPECT_EQ(at::mps::getCurrentMPSStream(), own);
  });
}

TEST_F(GlueTest, GetStreamFromGlobalPoolHandsOutWorkerStreamsRoundRobin) {
  std::set<c10::StreamId> ids;
  for (int i = 0; i < 2 * (at::mps::kStreamsPerPool - 1); ++i) {
    const c10::Stream s = guard()->getStreamFromGlobalPool(kMPS);
    EXPECT_NE(s.id(), 0);
    EXPECT_EQ(s.device_type(), c10::DeviceType::MPS);
    ids.insert(s.id());
  }
  EXPECT_EQ(ids.size(), size_t(at::mps::kStreamsPerPool - 1));
  EXPECT_NE(guard()->getNewStream(kMPS).id(), 0);
}

TEST_F(GlueTest, AStreamIdOutsideThePoolIsRejectedWithItsValue) {
  const c10::Stream bogus(c10::Stream::UNSAFE, kMPS, 4242);
  try {
    guard()->synchronizeStream(bogus);
    FAIL() << "synchronizeStream accepted stream id 4242";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("4242"), std::string::npos) << e.what();
  }
}

// torch.Event: recorded on stream A after a slow write that the dependency
// tracker does not see, waited on by stream B, whose copy then sees the
// write; only the event orders them.
TEST_F(GlueTest, EventRecordAndBlockOrderTwoStreams) {
  constexpr int kRounds = 20;
  c10::DataPtr src = glue::allocated(256);
  for (int r = 0; r < kRounds; ++r) {
    c10::Event event(c10::DeviceType::MPS);
    const c10::Stream a = at::mps::getMPSStream(3)->unwrap();
    const c10::Stream b = at::mps::getMPSStream(4)->unwrap();
    {
      c10::StreamGuard g(a);
      sim::BufferPtr buffer = sim::metal::bufferOf(glue::bufferOf(src));
      glue::encodeKernel(
          {glue::bufferOf(src)},
          [buffer, r] {
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            glue::words(*buffer)[0] = r;
          },
          glue::Tracking::kUntracked);
      event.record(a);
    }
    event.block(b);
    c10::StreamGuard g(b);
    c10::DataPtr dst = glue::allocated(256);
    glue::encodeCopy(glue::bufferOf(src), glue::bufferOf(dst));
    guard()->synchronizeStream(b);
    EXPECT_EQ(glue::words(glue::bufferOf(dst))[0], r);
    guard()->recordDataPtrOnStream(src, b);
  }
}

TEST_F(GlueTest, EventQueryTurnsTrueAndSynchronizeWaits) {
  c10::Event event(c10::DeviceType::MPS);
  EXPECT_TRUE(event.query()); // never recorded
  c10::DataPtr data = glue::allocated(64);
  sim::BufferPtr b = sim::metal::bufferOf(glue::bufferOf(data));
  glue::encodeKernel({glue::bufferOf(data)}, [b] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  event.record(at::mps::getCurrentMPSStream()->unwrap());
  event.synchronize();
  EXPECT_TRUE(event.query());
  EXPECT_TRUE(glue::eventually([&] { return event.query(); }));
}

// The kernel is encoded once the start's time exists, as in
// HooksEventApiAndReleasedIdsAreRefused, so it lies wholly between the times.
TEST_F(GlueTest, ElapsedTimeBetweenTwoTimingEventsCoversTheWorkBetweenThem) {
  c10::Event start(c10::DeviceType::MPS, c10::EventFlag::BACKEND_DEFAULT);
  c10::Event end(c10::DeviceType::MPS, c10::EventFlag::BACKEND_DEFAULT);
  const c10::Stream s = at::mps::getCurrentMPSStream()->unwrap();
  c10::DataPtr data = glue::allocated(64);
  start.record(s);
  EXPECT_EQ(start.elapsedTime(start), 0.0);
  glue::encodeKernel({glue::bufferOf(data)}, [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
  end.record(s);
  end.synchronize();
  const double ms = start.elapsedTime(end);
  EXPECT_GE(ms, 30.0);
  EXPECT_LT(ms, 10000.0);
}

// torch.Event traffic from many threads at once: each records on its own
// stream and its neighbour's stream waits for it.
TEST_F(GlueTest, EventsFromManyThreads) {
  constexpr int kThreads = 12;
  std::vector<c10::Stream> streams(kThreads, c10::Stream(c10::Stream::DEFAULT, kMPS));
  std::atomic<int> ready{0};
  glue::onThreads(kThreads, [&](int t) {
    streams[t] = at::mps::getCurrentMPSStream()->unwrap();
    ready.fetch_add(1);
    ASSERT_TRUE(glue::eventually([&] { return ready.load() == kThreads; }));
    c10::DataPtr data = glue::allocated(128);
    for (int i = 0; i < 25; ++i) {
      glue::encodeIncrement(glue::bufferOf(data));
      c10::Event event(c10::DeviceType::MPS);
      event.record(streams[t]);
      event.block(streams[(t + 1) % kThreads]);
      if (i % 5 == 0) {
        event.synchronize();
        EXPECT_TRUE(event.query());
      }
    }
    guard()->synchronizeStream(streams[t]);
    EXPECT_EQ(glue::words(glue::bufferOf(data))[0], 25);
  });
}

// Tensor.record_stream: a block allocated on A and used on B is not handed
// out again (to A or anyone) while B's work on it may still run; the
// fixture's hazard check at every handout is the judge.
TEST_F(GlueTest, RecordDataPtrOnStreamKeepsTheBlockFromReuseUntilTheUseCompleted) {
  constexpr int kRounds = 40;
  for (int r = 0; r < kRounds; ++r) {
    c10::DataPtr data = glue::allocated(4096);
    const c10::Stream b = at::mps::getMPSStream(2 + r % 6)->unwrap();
    glue::encodeSlowUseOn(b, glue::bufferOf(data));
    guard()->recordDataPtrOnStream(data, b);
    data.clear();
    std::thread([] { glue::allocated(4096); }).join();
    glue::allocated(4096);
  }
}

} // namespace
