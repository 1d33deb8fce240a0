// Layer norm's forward (layer_norm_mps of Normalization.mm) on both of its
// paths, compared with the CPU's native_layer_norm: the MPSGraph path
// (layer_norm_mps_graph, taken while several streams are active), run on the
// simulated MPSGraph (Note [simulated MPSGraph operations]), and the Metal
// kernel a lone stream takes, from the bundled shader library.

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/randn.h>
#include <c10/util/accumulate.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

// Static in Normalization.mm; the build's copy of it (extract_function.py)
// has external linkage.
namespace at::native {
std::tuple<Tensor, Tensor, Tensor> layer_norm_mps_graph(const Tensor& input,
                                                        const Tensor& weight,
                                                        const Tensor& bias,
                                                        int64_t normalized_ndim,
                                                        float epsilon,
                                                        const Tensor& out,
                                                        const Tensor& mean,
                                                        const Tensor& rstd);
} // namespace at::native

namespace {

using glue::GlueTest;

struct Case {
  std::vector<int64_t> shape;
  int64_t normalized_ndim;
  bool weight, bias;
  double eps;
  at::ScalarType dtype;
};

using LayerNormResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Waits for the calling thread's stream, then requires out, mean and rstd
// (MPS tensors) to be the CPU's.
void expectLayerNorm(const LayerNormResult& result, const LayerNormResult& expected) {
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const auto& [out, mean, rstd] = result;
  const auto& [cpu_out, cpu_mean, cpu_rstd] = expected;
  glue::expectClose(glue::toCPU(out), cpu_out, "out");
  glue::expectClose(glue::toCPU(mean).view(cpu_mean.sizes()), cpu_mean, "mean");
  glue::expectClose(glue::toCPU(rstd).view(cpu_rstd.sizes()), cpu_rstd, "rstd");
}

// layer_norm_mps_graph on the calling thread's stream, checked against the
// CPU; `weight` and `bias` are MPS tensors holding `cpu_weight`'s and
// `cpu_bias`'s values, or undefined.
void checkLayerNorm(const at::Tensor& cpu_input,
                    const at::Tensor& cpu_weight,
                    const at::Tensor& cpu_bias,
                    const at::Tensor& weight,
                    const at::Tensor& bias,
                    int64_t normalized_ndim,
                    double eps) {
  const auto sizes = cpu_input.sizes();
  const std::vector<int64_t> batch(sizes.begin(), sizes.end() - normalized_ndim);
  at::Tensor input = glue::toMPS(cpu_input);
  const at::ScalarType dtype = cpu_input.scalar_type();
  at::Tensor out = glue::mpsTensor(cpu_input.numel(), dtype).view(sizes);
  at::Tensor mean = glue::mpsTensor(c10::multiply_integers(batch), dtype).view(batch);
  at::Tensor rstd = glue::mpsTensor(c10::multiply_integers(batch), dtype).view(batch);
  @autoreleasepool {
    at::native::layer_norm_mps_graph(input, weight, bias, normalized_ndim, static_cast<float>(eps), out, mean, rstd);
  }
  expectLayerNorm(
      {out, mean, rstd},
      at::native_layer_norm(cpu_input, sizes.slice(sizes.size() - normalized_ndim), cpu_weight, cpu_bias, eps));
}

// The cases of test/test_mps_parallel.py's layer norm comparison: one or two
// normalized dims, with and without affine parameters, a weight without a
// bias and a bias without a weight, two epsilons.
const Case kCases[] = {
    {{4, 16, 64}, 1, true, true, 1e-5, at::kFloat},
    {{3, 8, 32}, 2, true, true, 1e-5, at::kFloat},
    {{2, 256}, 1, false, false, 1e-5, at::kFloat},
    {{8, 1024}, 1, true, true, 1e-3, at::kFloat},
    {{5, 48}, 1, true, false, 1e-5, at::kFloat},
    {{5, 48}, 1, false, true, 1e-5, at::kFloat},
};

// The cases, and float16, which the graph computes in float32 and casts back.
TEST_F(GlueTest, LayerNormGraphPathMatchesTheCPU) {
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({{4, 16, 64}, 1, true, true, 1e-5, at::kHalf});
  cases.push_back({{3, 8, 32}, 2, false, true, 1e-5, at::kHalf});
  at::manual_seed(0);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "input " << at::IntArrayRef(c.shape) << ", " << c.normalized_ndim
                                      << " normalized dims, weight " << c.weight << ", bias " << c.bias << ", "
                                      << c.dtype);
    const at::Tensor x = (at::randn(c.shape) * 3 + 1).to(c.dtype);
    const auto normalized = at::IntArrayRef(c.shape).slice(c.shape.size() - c.normalized_ndim);
    const at::Tensor w = c.weight ? at::randn(normalized).to(c.dtype) : at::Tensor();
    const at::Tensor b = c.bias ? at::randn(normalized).to(c.dtype) : at::Tensor();
    checkLayerNorm(x, w, b, glue::toMPS(w), glue::toMPS(b), c.normalized_ndim, c.eps);
  }
}

// Eight threads normalize their own inputs with one weight and bias on
// their own streams, as threads sharing a model do: one cached graph, its
// encodes one at a time, the CPU's results, and no cross-stream wait (the
// weight and bias are graph feeds, recorded as reads).
TEST_F(GlueTest, LayerNormGraphPathOnManyStreamsSharesItsWeightWithoutWaits) {
  at::manual_seed(1);
  const at::Tensor cpu_weight = at::randn({64}), cpu_bias = at::randn({64});
  const at::Tensor weight = glue::toMPS(cpu_weight), bias = glue::toMPS(cpu_bias);
  std::vector<at::Tensor> inputs;
  for (int t = 0; t < 8; ++t) {
    inputs.push_back(at::randn({4, 16, 64}) * (t + 1));
  }
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(8, [&](int t) {
    for (int r = 0; r < 5; ++r) {
      checkLayerNorm(inputs[t], cpu_weight, cpu_bias, weight, bias, 1, 1e-5);
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

// The bundled shader library's kernel for rows of up to 4,096 float
// elements, as layer_norm_mps binds it: input, output, mean, rstd, the four
// scalars, then weight and bias at 8 and 9 when used. The body reads its
// input, weight and bias (upstream's shader declares them `device T*`, which
// does not make them written; here they are declared `constant`, so the
// hazard detector counts what the body does).
constexpr const char* kLayerNormLibrary =
    "kernel void layer_norm_single_row_float(constant float* input, device float* output, device float* mean, "
    "device float* rstd, constant int& axis_size, constant float& epsilon, constant int& use_weight, "
    "constant int& use_bias, constant float* weight, constant float* bias) {}";

// Defines the kernel's body for `rows` rows of `n` elements (layer_norm_mps
// passes the sizes as constants, which the simulator does not keep, and
// buffers may be longer than their tensors) and counts its runs in `runs`.
void defineLayerNormKernel(int64_t rows, int64_t n, double eps, bool weight, bool bias, std::atomic<int>& runs) {
  sim::metal::setBundledShaderSource(kLayerNormLibrary);
  sim::metal::defineKernel(
      "layer_norm_single_row_float", [rows, n, eps, weight, bias, &runs](const std::vector<sim::BufferPtr>& buffers) {
        const auto* x = reinterpret_cast<const float*>(buffers.at(0)->contents());
        auto* out = reinterpret_cast<float*>(buffers.at(1)->contents());
        auto* mean = reinterpret_cast<float*>(buffers.at(2)->contents());
        auto* rstd = reinterpret_cast<float*>(buffers.at(3)->contents());
        const float* w = weight ? reinterpret_cast<const float*>(buffers.at(4)->contents()) : nullptr;
        const float* b = bias ? reinterpret_cast<const float*>(buffers.at(weight ? 5 : 4)->contents()) : nullptr;
        for (int64_t r = 0; r < rows; ++r) {
          double sum = 0, squares = 0;
          for (int64_t i = 0; i < n; ++i) {
            sum += x[r * n + i];
          }
          const double m = sum / n;
          for (int64_t i = 0; i < n; ++i) {
            squares += (x[r * n + i] - m) * (x[r * n + i] - m);
          }
          const double s = 1.0 / std::sqrt(squares / n + eps);
          mean[r] = static_cast<float>(m);
          rstd[r] = static_cast<float>(s);
          for (int64_t i = 0; i < n; ++i) {
            out[r * n + i] = static_cast<float>((x[r * n + i] - m) * s * (w ? w[i] : 1.0) + (b ? b[i] : 0.0));
          }
        }
        runs.fetch_add(1);
      });
}

// layer_norm_mps on the calling thread's stream, checked against `expected`,
// the CPU's native_layer_norm; `weight` and `bias` are MPS tensors or
// undefined.
void checkLayerNormMPS(const at::Tensor& cpu_input,
                       const at::Tensor& weight,
                       const at::Tensor& bias,
                       int64_t normalized_ndim,
                       double eps,
                       const LayerNormResult& expected) {
  const auto sizes = cpu_input.sizes();
  LayerNormResult result;
  @autoreleasepool {
    result = at::native::layer_norm_mps(glue::toMPS(cpu_input),
                                        sizes.slice(sizes.size() - normalized_ndim),
                                        weight.defined() ? std::optional(weight) : std::nullopt,
                                        bias.defined() ? std::optional(bias) : std::nullopt,
                                        eps);
  }
  expectLayerNorm(result, expected);
}

// A lone stream takes the Metal-kernel path: for each case the kernel runs
// once, with the CPU's results.
TEST_F(GlueTest, LayerNormOnALoneStreamTakesTheKernelPathAndMatchesTheCPU) {
  at::manual_seed(2);
  std::atomic<int> runs{0};
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "input " << at::IntArrayRef(c.shape) << ", " << c.normalized_ndim
                                      << " normalized dims, weight " << c.weight << ", bias " << c.bias);
    const auto normalized = at::IntArrayRef(c.shape).slice(c.shape.size() - c.normalized_ndim);
    const int64_t n = c10::multiply_integers(normalized);
    defineLayerNormKernel(c10::multiply_integers(c.shape) / n, n, c.eps, c.weight, c.bias, runs);
    const at::Tensor x = at::randn(c.shape) * 3 + 1;
    const at::Tensor w = c.weight ? at::randn(normalized) : at::Tensor();
    const at::Tensor b = c.bias ? at::randn(normalized) : at::Tensor();
    const int before = runs.load();
    checkLayerNormMPS(
        x, glue::toMPS(w), glue::toMPS(b), c.normalized_ndim, c.eps, at::native_layer_norm(x, normalized, w, b, c.eps));
    EXPECT_EQ(runs.load(), before + 1) << "the kernel did not run once";
  }
}

// Eight threads start at once with one weight and bias, as a thread pool's
// first requests do: the first to encode may be alone and take the kernel
// path while the others join it on the graph path. The results are the
// CPU's, with no wait and no error: the kernel path binds its input, weight
// and bias as reads.
TEST_F(GlueTest, LayerNormOnStreamsJoiningALoneStreamNeedsNoOrder) {
  at::manual_seed(3);
  std::atomic<int> runs{0};
  defineLayerNormKernel(4 * 16, 64, 1e-5, true, true, runs);
  const at::Tensor cpu_weight = at::randn({64}), cpu_bias = at::randn({64});
  const at::Tensor weight = glue::toMPS(cpu_weight), bias = glue::toMPS(cpu_bias);
  // The CPU's results are computed before the threads start (see
  // glue_linear_test.mm's SharedModel).
  std::vector<at::Tensor> inputs;
  std::vector<LayerNormResult> expected;
  for (int t = 0; t < 8; ++t) {
    inputs.push_back(at::randn({4, 16, 64}) * (t + 1));
    expected.push_back(at::native_layer_norm(inputs[t], {64}, cpu_weight, cpu_bias, 1e-5));
  }
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(8, [&](int t) {
    for (int r = 0; r < 5; ++r) {
      checkLayerNormMPS(inputs[t], weight, bias, 1, 1e-5, expected[t]);
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

} // namespace
