// Backward passes through libtorch's autograd engine (the wheel's), which
// runs the nodes of MPS tensors on its MPS device thread, not on the thread
// that called backward(): each node under a stream guard for the stream its
// forward ran on, and c10::Event waits where a gradient crosses streams.

#include "GlueTest.h"

#include <ATen/mps/MPSStream.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace {

using glue::GlueTest;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward nodes saw, over a test.
std::atomic<int> g_backwards{0};
std::atomic<int> g_off_forward_stream{0};
std::atomic<int> g_on_forward_thread{0};

int64_t threadKey() {
  return static_cast<int64_t>(std::hash<std::thread::id>()(std::this_thread::get_id()));
}

// y = 2 x as a 300 µs MPS kernel on the current stream; its backward,
// dx = 2 dy, the same on the stream current where the engine runs it.
at::Tensor doubled(const at::Tensor& x) {
  at::Tensor y = glue::mpsTensor(x.numel(), at::kFloat);
  sim::BufferPtr in = sim::metal::bufferOf(glue::bufferOf(x));
  sim::BufferPtr out = sim::metal::bufferOf(glue::bufferOf(y));
  const int64_t n = x.numel();
  glue::encodeKernel({glue::bufferOf(x), glue::bufferOf(y)}, [in, out, n] {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    for (int64_t i = 0; i < n; ++i) {
      glue::elements<float>(out)[i] = 2 * glue::elements<float>(in)[i];
    }
  });
  return y;
}

struct Doubling : torch::autograd::Function<Doubling> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->saved_data["stream"] = reinterpret_cast<int64_t>(at::mps::getCurrentMPSStream());
    ctx->saved_data["thread"] = threadKey();
    return doubled(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ++g_backwards;
    if (ctx->saved_data["stream"].toInt() != reinterpret_cast<int64_t>(at::mps::getCurrentMPSStream())) {
      ++g_off_forward_stream;
    }
    if (ctx->saved_data["thread"].toInt() == threadKey()) {
      ++g_on_forward_thread;
    }
    return {doubled(grads[0])};
  }
};

void resetSeen() {
  g_backwards = 0;
  g_off_forward_stream = 0;
  g_on_forward_thread = 0;
}

// The main thread (on the default stream) and then four threads at once
// train, each its own leaf through two Doubling nodes, with no
// synchronization between forward and backward: every backward node runs on
// the engine's thread on its forward's stream, and each .grad (4 dy) reads
// right after a synchronize of the thread's stream, which is where the
// engine leaves it. Once the threads exit, one worker stream stays leased:
// the engine's thread leases it when its first guard asks for its current
// stream, and keeps it, unused, for as long as the thread lives.
TEST_F(GlueTest, BackwardNodesRunOnTheirForwardsStreamOnTheEnginesThread) {
  constexpr int kThreads = 4, kRounds = 5;
  resetSeen();
  auto train = [](int i) {
    at::Tensor x = glue::toMPS(at::arange(i, i + 16, at::kFloat)).requires_grad_(true);
    at::Tensor y = Doubling::apply(Doubling::apply(x));
    y.backward(glue::toMPS(at::ones({16}, at::kFloat)));
    at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    glue::expectClose(glue::toCPU(x.grad()), at::full({16}, 4.0f), "x.grad");
  };
  for (int round = 0; round < kRounds; ++round) {
    train(kThreads);
    glue::onThreads(kThreads, train);
    EXPECT_EQ(glue::leasedSlots(), 1) << "round " << round;
  }
  EXPECT_EQ(g_backwards.load(), 2 * (kThreads + 1) * kRounds);
  EXPECT_EQ(g_off_forward_stream.load(), 0);
  EXPECT_EQ(g_on_forward_thread.load(), 0);
}

// Threads share one leaf, as data-parallel threads share weights: its
// AccumulateGrad node runs on the stream of whichever thread made it, so the
// gradients of other threads' passes cross streams to reach it (ordered by
// the engine's c10::Event waits and by the dependency tracker). After every
// thread, .grad holds the sum of all passes. The forwards take turns: two
// threads making nodes with an edge to one AccumulateGrad write its
// has_parent_ flag at once, a data race in PyTorch's autograd that TSan
// reports (pytorch/pytorch#58442, #67653).
TEST_F(GlueTest, ThreadsSharingALeafAccumulateEveryGradient) {
  constexpr int kThreads = 6, kPasses = 4;
  resetSeen();
  at::Tensor w = glue::toMPS(at::arange(32, at::kFloat)).requires_grad_(true);
  std::mutex graph_mu;
  glue::onThreads(kThreads, [&](int) {
    for (int p = 0; p < kPasses; ++p) {
      at::Tensor y;
      {
        std::lock_guard<std::mutex> lock(graph_mu);
        y = Doubling::apply(w);
      }
      y.backward(glue::toMPS(at::ones({32}, at::kFloat)));
    }
  });
  at::mps::getMPSStreamPool().synchronizeAll();
  glue::expectClose(glue::toCPU(w.grad()), at::full({32}, 2.0f * kThreads * kPasses), "w.grad");
  EXPECT_EQ(g_backwards.load(), kThreads * kPasses);
  EXPECT_EQ(g_off_forward_stream.load(), 0);
}

// 31 threads hold every worker stream, with MPS_STREAM_POOL_WAIT_TIMEOUT_MS
// set, and then each runs a backward pass. The engine's thread has no stream
// of its own, and its first guard's query must not wait for one
// (Note [MPS stream queries]): when it did, it waited out the timeout and
// failed a backward pass while the threads holding every stream waited for
// theirs, and with -1 it waited forever. A 32nd thread's first op still
// raises the timeout's error, so the variable is in effect, and the engine's
// thread ends up holding no lease.
TEST_F(GlueTest, BackwardOnAnExhaustedPoolDoesNotWaitForAStream) {
  setenv("MPS_STREAM_POOL_WAIT_TIMEOUT_MS", "200", 1);
  constexpr int kThreads = at::mps::kWorkerStreams;
  std::atomic<int> leased{0}, trained{0};
  std::atomic<bool> checked{false};
  glue::onThreads(kThreads + 1, [&](int i) {
    if (i == kThreads) {
      ASSERT_TRUE(glue::eventually([&] { return trained.load() == kThreads; }));
      try {
        at::mps::getCurrentMPSStream();
        ADD_FAILURE() << "a 32nd thread got a stream";
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("MPS_STREAM_POOL_WAIT_TIMEOUT_MS=200 ms"), std::string::npos) << e.what();
      }
      checked = true;
      return;
    }
    at::Tensor x = glue::toMPS(at::arange(i, i + 16, at::kFloat)).requires_grad_(true);
    ++leased;
    ASSERT_TRUE(glue::eventually([&] { return leased.load() == kThreads; }));
    Doubling::apply(x).backward(glue::toMPS(at::ones({16}, at::kFloat)));
    at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    glue::expectClose(glue::toCPU(x.grad()), at::full({16}, 2.0f), "x.grad");
    ++trained;
    ASSERT_TRUE(glue::eventually([&] { return checked.load(); }));
  });
  EXPECT_EQ(glue::leasedSlots(), 0);
}

} // namespace
