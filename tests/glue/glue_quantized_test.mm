// Quantized.mm's weight-only quantized matrix products (_weight_int8pack_mm
// and _weight_int4pack_mm, which quantized linear layers call on MPS) on
// threads that share a model's quantized weight and scales. The kernels'
// bodies are the test's, in the bundled shader library.

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using glue::GlueTest;

constexpr int64_t kM = 4, kK = 32, kN = 32;

// The sizes are constants (setBytes), which the simulator does not keep;
// the bodies know them.
constexpr const char* kQuantizedLibrary =
    "kernel void int8pack_mv_float(constant float* A, constant char* B, constant float* scales, "
    "device float* C) {}\n"
    "kernel void int4pack_mm_32_float(constant float* A, constant int* B, constant float* scales_and_zeros, "
    "device float* C) {}\n";

void defineQuantizedKernels() {
  sim::metal::setBundledShaderSource(kQuantizedLibrary);
  // C = A (B * scales)^T, B int8 of N rows of K.
  sim::metal::defineKernel("int8pack_mv_float", [](const std::vector<sim::BufferPtr>& buffers) {
    const float* a = glue::elements<float>(buffers.at(0));
    const int8_t* b = glue::elements<int8_t>(buffers.at(1));
    const float* scales = glue::elements<float>(buffers.at(2));
    float* c = glue::elements<float>(buffers.at(3));
    for (int64_t m = 0; m < kM; ++m) {
      for (int64_t n = 0; n < kN; ++n) {
        float sum = 0;
        for (int64_t k = 0; k < kK; ++k) {
          sum += a[m * kK + k] * b[n * kK + k];
        }
        c[m * kN + n] = sum * scales[n];
      }
    }
  });
  // The int4 layout is not modelled: the body marks each output element.
  sim::metal::defineKernel("int4pack_mm_32_float", [](const std::vector<sim::BufferPtr>& buffers) {
    std::fill_n(glue::elements<float>(buffers.at(3)), kM * kN, 1.0f);
  });
}

// Eight threads multiply inputs of their own by one int8 weight with its
// scales, and by one int4-packed weight with its scales and zeros, five
// times each, as threads sharing a quantized model do: the CPU's int8
// products, the int4 kernel's output, and no cross-stream wait, as the
// kernels bind their inputs as reads. With them bound as writes, as v2.9.1
// binds them, the tracker counted 75 to 76 waits; with either kernel's
// alone, 39.
TEST_F(GlueTest, QuantizedMatrixProductsOnManyStreamsShareTheirWeightWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 5;
  defineQuantizedKernels();
  // Small integers, so that both orders of summing and scaling are exact.
  const at::Tensor cpu_b = at::randint(-8, 8, {kN, kK}, at::kChar), cpu_scales = at::randint(1, 4, {kN}).to(at::kFloat);
  std::vector<at::Tensor> inputs, expected;
  for (int i = 0; i < kThreads * kRounds; ++i) {
    inputs.push_back(at::randint(-9, 10, {kM, kK}).to(at::kFloat));
    expected.push_back(at::matmul(inputs.back(), (cpu_b.to(at::kFloat) * cpu_scales.unsqueeze(1)).t()));
  }
  const at::Tensor b = glue::toMPS(cpu_b), scales = glue::toMPS(cpu_scales);
  // int4pack_mm's shapes: B [N / 8, K / 32, 32, 4] int32, scales and zeros
  // [K / 32, N, 2].
  const at::Tensor b4 = glue::toMPS(at::zeros({kN / 8, kK / 32, 32, 4}, at::kInt));
  const at::Tensor scales_and_zeros = glue::toMPS(at::zeros({kK / 32, kN, 2}));
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int t) {
    for (int r = 0; r < kRounds; ++r) {
      const at::Tensor a = glue::toMPS(inputs[t * kRounds + r]);
      at::Tensor c8, c4;
      @autoreleasepool {
        c8 = at::native::_weight_int8pack_mm_mps(a, b, scales);
        c4 = at::native::_weight_int4pack_mm_mps(a, b4, 32, scales_and_zeros);
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      glue::expectClose(glue::toCPU(c8), expected[t * kRounds + r], "int8pack_mm");
      EXPECT_TRUE(glue::toCPU(c4).eq(1).all().item<bool>()) << "int4pack_mm";
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

} // namespace
