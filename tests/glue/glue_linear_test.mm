// nn.Linear's forward (_mps_linear of Linear.mm) on both of its paths, run on
// the simulator and compared with the CPU's linear: the MPSNDArray matrix
// multiplication that a lone stream takes, and the MPSGraph that any stream
// takes while another one is active (Note [MPS Apple framework workarounds]).

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/mps/MPSProfiler.h>
#include <ATen/native/mps/Copy.h>
#include <ATen/native/mps/OperationUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

namespace {

using at::native::mps::getTensorsStringKey;
using glue::GlueTest;

enum class Path { kKernel, kGraph };

struct Case {
  std::vector<int64_t> input, weight;
  bool bias;
};

// 2-D inputs as the macOS suite's model has; a 3-D input with a bias, which
// the graph path flattens to 2-D and reshapes back; a 5-D input, which it
// always flattens; a 1-D weight, whose output loses its last dimension.
const Case kCases[] = {
    {{4, 64}, {32, 64}, true},
    {{4, 64}, {32, 64}, false},
    {{2, 3, 48}, {16, 48}, true},
    {{2, 3, 48}, {16, 48}, false},
    {{2, 1, 2, 3, 8}, {5, 8}, true},
    {{6, 40}, {40}, false},
};

// Whether the kernel or graph of `path` for these operands is cached: each
// path caches its own under its own key.
bool cached(Path path, const at::Tensor& input, const at::Tensor& weight_arg, const at::Tensor& bias) {
  const at::Tensor weight = weight_arg.dim() == 1 ? weight_arg.unsqueeze(0) : weight_arg;
  return path == Path::kKernel ? at::native::mps::MPSKernelCache::getInstance()->LookUp(
                                     "mps_linear" + getTensorsStringKey({input, weight, bias}, true, true)) != nullptr
                               : at::native::mps::MPSGraphCache::getInstance()->LookUp(
                                     "mps_linear" + getTensorsStringKey({input, weight, bias})) != nullptr;
}

// _mps_linear on the calling thread's stream, in an autorelease pool as ops
// are called; left uncommitted.
at::Tensor runLinear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  @autoreleasepool {
    return at::native::_mps_linear(input, weight, bias.defined() ? std::optional(bias) : std::nullopt);
  }
}

// _mps_linear on the calling thread's stream, checked against `expected`,
// the CPU's linear; `weight` and `bias` are MPS tensors (an undefined bias:
// none).
void checkLinear(const at::Tensor& cpu_input,
                 const at::Tensor& weight,
                 const at::Tensor& bias,
                 const at::Tensor& expected,
                 Path path) {
  const at::Tensor input = glue::toMPS(cpu_input);
  const Path other = path == Path::kKernel ? Path::kGraph : Path::kKernel;
  const bool other_cached = cached(other, input, weight, bias);
  const at::Tensor out = runLinear(input, weight, bias);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  glue::expectClose(glue::toCPU(out), expected, "out");
  // The path taken cached its kernel or graph, and the other path's was not
  // made.
  EXPECT_TRUE(cached(path, input, weight, bias)) << (path == Path::kKernel ? "no kernel" : "no graph");
  EXPECT_EQ(cached(other, input, weight, bias), other_cached) << "the other path ran";
}

void checkCases(Path path) {
  at::manual_seed(0);
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "input " << at::IntArrayRef(c.input) << ", weight "
                                      << at::IntArrayRef(c.weight) << ", bias " << c.bias);
    const at::Tensor x = at::randn(c.input), w = at::randn(c.weight);
    const at::Tensor b = c.bias ? at::randn({c.weight.front()}) : at::Tensor();
    checkLinear(x, glue::toMPS(w), glue::toMPS(b), at::linear(x, w, b), path);
  }
}

TEST_F(GlueTest, LinearOnALoneStreamTakesTheKernelPathAndMatchesTheCPU) {
  checkCases(Path::kKernel);
}

// A worker thread keeps its own stream encoding, so the main thread's
// stream is never the only active one.
TEST_F(GlueTest, LinearWhileAnotherStreamEncodesTakesTheGraphPathAndMatchesTheCPU) {
  std::atomic<bool> started{false}, stop{false};
  std::thread worker([&] {
    const at::Tensor scratch = glue::mpsTensor(8);
    while (!stop.load()) {
      glue::encodeKernel({glue::bufferOf(scratch)}, [] {});
      started.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  });
  ASSERT_TRUE(glue::eventually([&] { return started.load(); }));
  checkCases(Path::kGraph);
  stop.store(true);
  worker.join();
}

// One weight and bias that `threads` threads apply to inputs of their own
// (of eight magnitudes, which expectClose's tolerance allows), with the
// CPU's results. These are computed here: the wheel is not built
// with ThreadSanitizer, which does not see the guard of the function-local
// statics its CPU linear makes on first use, and reports them as racing when
// threads call it at once.
struct SharedModel {
  explicit SharedModel(int threads) {
    at::manual_seed(1);
    cpu_weight = at::randn({32, 64});
    cpu_bias = at::randn({32});
    weight = glue::toMPS(cpu_weight);
    bias = glue::toMPS(cpu_bias);
    for (int t = 0; t < threads; ++t) {
      inputs.push_back(at::randn({4, 64}) * (t % 8 + 1));
      expected.push_back(at::linear(inputs[t], cpu_weight, cpu_bias));
    }
  }
  at::Tensor cpu_weight, cpu_bias, weight, bias;
  std::vector<at::Tensor> inputs, expected;
};

// Eight threads apply one weight and bias on their own streams, as threads
// sharing a model do. Each has encoded before any of them runs linear, so
// all take the graph path: one cached graph, the CPU's results, and no
// cross-stream wait (the weight and bias are graph feeds, recorded as reads).
TEST_F(GlueTest, LinearOnManyStreamsSharesItsWeightWithoutWaits) {
  const SharedModel model(8);
  const int64_t waits_before = glue::trackerWaits();
  std::atomic<int> encoded{0};
  glue::onThreads(8, [&](int t) {
    const at::Tensor scratch = glue::mpsTensor(8);
    glue::encodeKernel({glue::bufferOf(scratch)}, [] {});
    encoded.fetch_add(1);
    ASSERT_TRUE(glue::eventually([&] { return encoded.load() == 8; }));
    for (int r = 0; r < 5; ++r) {
      checkLinear(model.inputs[t], model.weight, model.bias, model.expected[t], Path::kGraph);
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

// A lone stream's linear takes the Metal-kernel path, which reads its input,
// weight and bias; another stream's graph-path linear with the same weight
// and bias, while the first one's work is still open, then needs no order.
// With the kernel path's operands recorded as written, the tracker counted
// the second stream's wait for the first.
TEST_F(GlueTest, LinearKernelPathRecordsItsOperandsAsReads) {
  const SharedModel model(2);
  const int64_t waits_before = glue::trackerWaits();
  const at::Tensor input = glue::toMPS(model.inputs[0]);
  const at::Tensor out = runLinear(input, model.weight, model.bias);
  ASSERT_TRUE(cached(Path::kKernel, input, model.weight, model.bias));
  std::thread([&] {
    const at::Tensor other_input = glue::toMPS(model.inputs[1]);
    const at::Tensor other = runLinear(other_input, model.weight, model.bias);
    EXPECT_TRUE(cached(Path::kGraph, other_input, model.weight, model.bias));
    at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    glue::expectClose(glue::toCPU(other), model.expected[1], "the other stream's out");
  }).join();
  EXPECT_EQ(glue::trackerWaits(), waits_before);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  glue::expectClose(glue::toCPU(out), model.expected[0], "out");
}

// Eight threads start at once, as a thread pool's first requests do: the
// first to encode may be alone and take the kernel path while the others
// join it on the graph path. The results are the CPU's, with no wait and no
// error. With the kernel path's operands recorded as written, 14 of 16 runs
// raised "neither can go first" on two streams (a false cycle: both only
// read the weight).
TEST_F(GlueTest, LinearOnStreamsJoiningALoneStreamNeedsNoOrder) {
  const SharedModel model(8);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(8, [&](int t) {
    for (int r = 0; r < 5; ++r) {
      const at::Tensor out = runLinear(glue::toMPS(model.inputs[t]), model.weight, model.bias);
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      glue::expectClose(glue::toCPU(out), model.expected[t], "out");
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

// More threads than the pool has worker streams, so that some share one:
// their ops interleave in one serial section and one command buffer, and a
// block one thread frees comes back to another on the same stream while the
// first one's linear may still read it. The results are the CPU's. Before
// toMPS waited for the stream, its write from the host overtook such reads,
// and 8 to 13 of 20 runs gave wrong results.
TEST_F(GlueTest, LinearOnMoreThreadsThanStreams) {
  constexpr int kThreads = at::mps::kStreamsPerPool + 8;
  const SharedModel model(kThreads);
  glue::onThreads(kThreads, [&](int t) {
    for (int r = 0; r < 5; ++r) {
      const at::Tensor out = runLinear(glue::toMPS(model.inputs[t]), model.weight, model.bias);
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      glue::expectClose(glue::toCPU(out), model.expected[t], "out");
    }
  });
}

// The MPS profiler, with operation and copy statistics and signpost
// intervals on, while eight streams run linear and copy its result to the
// CPU at once (Note [MPS profiler and streams]): ops on every stream and the
// profiler's handlers on the completion thread update its records. Under
// ThreadSanitizer a record read or written outside the profiler's lock is a
// reported race; the results are the CPU's in every variant.
TEST_F(GlueTest, ProfiledLinearAndCopiesOnManyStreams) {
  // Read when the profiler is made, with the first stream.
  setenv("PYTORCH_MPS_LOG_PROFILE_INFO", "48", 1); // operation and copy statistics
  setenv("PYTORCH_MPS_TRACE_SIGNPOSTS", "2", 1); // all signpost intervals
  const at::mps::Profiler::MPSProfiler& profiler = at::mps::getMPSProfiler();
  ASSERT_TRUE(profiler.isOperationProfilingEnabled() && profiler.isCopyProfilingEnabled() &&
              profiler.isSignpostTracingEnabled())
      << "the profiler was made before this test set its environment; run the test in a process of its own";
  const SharedModel model(8);
  glue::onThreads(8, [&](int t) {
    for (int r = 0; r < 5; ++r) {
      at::Tensor result = at::empty(model.expected[t].sizes());
      @autoreleasepool {
        const at::Tensor out = runLinear(glue::toMPS(model.inputs[t]), model.weight, model.bias);
        at::native::mps::mps_copy_(result, out, /*non_blocking=*/false);
      }
      glue::expectClose(result, model.expected[t], "out");
    }
  });
}

} // namespace
