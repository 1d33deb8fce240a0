// RMSNorm.mm's fused RMS norm (_fused_rms_norm_mps, which F.rms_norm takes
// on MPS for contiguous inputs) on threads that share a model's weight, its
// Metal kernel's body the test's, in the bundled shader library.

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rms_norm.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

using glue::GlueTest;

constexpr int64_t kRows = 4, kCols = 32;
constexpr double kEps = 1e-5;

// eps and the row length are constants (setBytes), which the simulator does
// not keep; the body knows them.
constexpr const char* kRmsNormLibrary =
    "kernel void rms_norm_float(constant float* input, constant float* weight, device float* output) {}\n";

void defineRmsNormKernel() {
  sim::metal::setBundledShaderSource(kRmsNormLibrary);
  sim::metal::defineKernel("rms_norm_float", [](const std::vector<sim::BufferPtr>& buffers) {
    const float* x = glue::elements<float>(buffers.at(0));
    const float* w = glue::elements<float>(buffers.at(1));
    float* out = glue::elements<float>(buffers.at(2));
    for (int64_t r = 0; r < kRows; ++r) {
      double squares = 0;
      for (int64_t c = 0; c < kCols; ++c) {
        squares += double(x[r * kCols + c]) * x[r * kCols + c];
      }
      const double scale = 1 / std::sqrt(squares / kCols + kEps);
      for (int64_t c = 0; c < kCols; ++c) {
        out[r * kCols + c] = float(w[c] * x[r * kCols + c] * scale);
      }
    }
  });
}

// Eight threads normalize inputs of their own and one shared input with one
// weight, five times each, as threads sharing a model do: the CPU's results,
// and no cross-stream wait, as the kernel binds its input and weight as
// reads. With both bound as writes, as v2.9.1 binds them, the tracker
// counted 58 to 111 waits, and in 2 of 4 runs five threads raised "neither
// can go first"; with the weight alone, 78 to 79 waits; with the input
// alone, 39.
TEST_F(GlueTest, RmsNormOnManyStreamsSharesItsWeightWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 5;
  defineRmsNormKernel();
  const at::Tensor cpu_weight = at::randn({kCols});
  std::vector<at::Tensor> inputs, expected;
  for (int i = 0; i < kThreads * kRounds; ++i) {
    inputs.push_back(at::randn({kRows, kCols}));
    expected.push_back(at::rms_norm(inputs.back(), {kCols}, cpu_weight, kEps));
  }
  const at::Tensor cpu_shared = at::randn({kRows, kCols});
  const at::Tensor shared_expected = at::rms_norm(cpu_shared, {kCols}, cpu_weight, kEps);
  const at::Tensor weight = glue::toMPS(cpu_weight), shared = glue::toMPS(cpu_shared);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int t) {
    for (int r = 0; r < kRounds; ++r) {
      const at::Tensor input = glue::toMPS(inputs[t * kRounds + r]);
      at::Tensor out, shared_out;
      @autoreleasepool {
        out = std::get<0>(at::native::_fused_rms_norm_mps(input, {kCols}, weight, kEps));
        shared_out = std::get<0>(at::native::_fused_rms_norm_mps(shared, {kCols}, weight, kEps));
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      glue::expectClose(glue::toCPU(out), expected[t * kRounds + r], "rms_norm");
      glue::expectClose(glue::toCPU(shared_out), shared_expected, "rms_norm of the shared input");
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

} // namespace
