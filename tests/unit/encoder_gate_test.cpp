// The opt-in encoder-lifecycle gate: off by default and pass-through when off;
// when on, compute-encoder creation and end are serialised across streams.

#include "SimStream.h"
#include "harness.h"

#include <ATen/mps/MPSCommandBufferLifecycle.h>
#include <ATen/mps/MPSSerialDispatch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using harness::getWithin;

using at::mps::computeEncoderGate;
using at::mps::EncoderLifecycleGate;
using at::mps::GatedEncoderOps;
using at::mps::SyncType;
using namespace std::chrono_literals;

constexpr const char* kVar = "MPS_SERIALIZE_COMPUTE_ENCODERS";

// A rendezvous that reports failure instead of hanging.
class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n) {}
  bool arriveAndWait(std::chrono::milliseconds limit = 5000ms) {
    std::unique_lock<std::mutex> lock(mu_);
    if (--n_ <= 0) {
      cv_.notify_all();
    }
    return cv_.wait_for(lock, limit, [&] { return n_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
};

// True if two callers were inside gate.run() at once (the gate is off).
bool runsConcurrently(EncoderLifecycleGate& gate) {
  Rendezvous both(2);
  auto enter = [&] { return gate.run([&] { return both.arriveAndWait(); }); };
  auto a = std::async(std::launch::async, enter);
  auto b = std::async(std::launch::async, enter);
  const bool met_a = getWithin(a);
  return getWithin(b) && met_a;
}

TEST(EncoderGateTest, GateThatIsOffLetsCallersRunConcurrently) {
  EncoderLifecycleGate gate(false);
  EXPECT_TRUE(runsConcurrently(gate));
}

TEST(EncoderGateTest, GateThatIsOnRunsOneCallerAtATime) {
  EncoderLifecycleGate gate(true);
  std::promise<void> inside, release;
  auto first = std::async(std::launch::async, [&] {
    gate.run([&] {
      inside.set_value();
      release.get_future().wait();
    });
  });
  inside.get_future().wait();
  std::atomic<bool> entered{false};
  auto second = std::async(
      std::launch::async, [&] { gate.run([&] { entered = true; }); });
  EXPECT_EQ(second.wait_for(50ms), std::future_status::timeout);
  EXPECT_FALSE(entered);
  release.set_value();
  getWithin(first);
  getWithin(second);
  EXPECT_TRUE(entered);
}

TEST(EncoderGateTest, ReturnsTheResultAndReleasesTheGateOnException) {
  EncoderLifecycleGate gate(true);
  EXPECT_EQ(gate.run([] { return 5; }), 5);
  EXPECT_THROW(
      gate.run([]() -> int { throw std::runtime_error("encoder failed"); }),
      std::runtime_error);
  // Not left locked: the same thread gets through again.
  EXPECT_EQ(gate.run([] { return 6; }), 6);
}

// The process gate is made once per process, so one test follows its life;
// no other test here may call computeEncoderGate().
TEST(EncoderGateTest, ProcessGateRejectsMalformedValuesThenReadsOnce) {
  {
    harness::ScopedEnv env(kVar, "on");
    EXPECT_TORCH_ERROR(
        computeEncoderGate(), "MPS_SERIALIZE_COMPUTE_ENCODERS='on'");
    EXPECT_TORCH_ERROR(
        computeEncoderGate(), "Accepted values: 1 (create and end");
  }
  harness::ScopedEnv env(kVar, nullptr);
  EncoderLifecycleGate& gate = computeEncoderGate();
  EXPECT_TRUE(runsConcurrently(gate));
  harness::ScopedEnv later(kVar, "1");
  EXPECT_EQ(&computeEncoderGate(), &gate);
  EXPECT_TRUE(runsConcurrently(gate));
}

// Counts encoder lifecycle transitions in flight across every stream.
struct TransitionProbe {
  std::atomic<int> in_flight{0};
  std::atomic<int> max_in_flight{0};
  std::atomic<int> transitions{0};
  std::function<void()> while_inside = [] {
    std::this_thread::sleep_for(20us);
  };

  template <typename Fn>
  auto observe(Fn&& fn) {
    const int now = in_flight.fetch_add(1) + 1;
    int seen = max_in_flight.load();
    while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
    }
    while_inside();
    auto result = fn();
    transitions.fetch_add(1);
    in_flight.fetch_sub(1);
    return result;
  }
};

struct ProbeOps : sim::SimOps {
  std::shared_ptr<TransitionProbe> probe;

  Encoder makeComputeEncoder(const Buffer& buffer) {
    return probe->observe([&] { return SimOps::makeComputeEncoder(buffer); });
  }
  void endEncoding(const Encoder& encoder) {
    probe->observe([&] {
      SimOps::endEncoding(encoder);
      return 0;
    });
  }
};

using GatedLifecycle =
    at::mps::CommandBufferLifecycle<GatedEncoderOps<ProbeOps>>;

class GatedLifecycleTest : public harness::SimTest {
 protected:
  void releaseResources() override {
    streams_.clear();
  }
  GatedLifecycle& makeStream(EncoderLifecycleGate& gate) {
    ProbeOps ops;
    ops.probe = probe_;
    ops.timeline = device().newSharedEvent();
    streams_.push_back(std::make_unique<GatedLifecycle>(
        GatedEncoderOps<ProbeOps>(ops, gate),
        device().newCommandQueue(),
        false));
    return *streams_.back();
  }
  // One pass of the way an op encodes: open an encoder, dispatch, end it.
  static void encodeOnePass(GatedLifecycle& lc) {
    lc.commandEncoder()->dispatch(sim::Kernel{{}, [] {}});
    lc.endKernelCoalescing();
  }

  std::shared_ptr<TransitionProbe> probe_ = std::make_shared<TransitionProbe>();
  std::vector<std::unique_ptr<GatedLifecycle>> streams_;
};

TEST_F(
    GatedLifecycleTest,
    GateThatIsOnSerialisesEncoderLifecycleAcrossStreams) {
  EncoderLifecycleGate gate(true);
  constexpr int kStreams = 4;
  const int kPasses = 200 * harness::stressScale();
  for (int s = 0; s < kStreams; ++s) {
    makeStream(gate);
  }
  harness::Latch start(kStreams);
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      GatedLifecycle& lc = *streams_[s];
      start.arriveAndWait();
      for (int i = 0; i < kPasses; ++i) {
        encodeOnePass(lc);
        if (i % 16 == 15) {
          lc.synchronize(SyncType::COMMIT);
        }
      }
      lc.synchronize(SyncType::COMMIT_AND_WAIT);
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_EQ(probe_->max_in_flight.load(), 1);
  EXPECT_EQ(probe_->transitions.load(), 2 * kStreams * kPasses);
}

TEST_F(GatedLifecycleTest, GateThatIsOffPassesLifecycleCallsStraightThrough) {
  EncoderLifecycleGate gate(false);
  GatedLifecycle& a = makeStream(gate);
  GatedLifecycle& b = makeStream(gate);
  // Both streams must be inside encoder creation at the same time.
  Rendezvous both(2);
  probe_->while_inside = [&] { EXPECT_TRUE(both.arriveAndWait()); };
  auto in_a = std::async(std::launch::async, [&] { a.commandEncoder(); });
  auto in_b = std::async(std::launch::async, [&] { b.commandEncoder(); });
  getWithin(in_a);
  getWithin(in_b);
  probe_->while_inside = [] {};
  EXPECT_EQ(probe_->max_in_flight.load(), 2);
  a.synchronize(SyncType::COMMIT_AND_WAIT);
  b.synchronize(SyncType::COMMIT_AND_WAIT);
}

} // namespace
