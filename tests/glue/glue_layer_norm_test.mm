// Layer norm's MPSGraph path (layer_norm_mps_graph of Normalization.mm, the
// path layer_norm_mps takes while several streams are active), run on the
// simulated MPSGraph (Note [simulated MPSGraph operations]) and compared
// with the CPU's native_layer_norm.

#include "GlueTest.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/randn.h>
#include <c10/util/accumulate.h>

#include <cstdint>
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
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const auto [cpu_out, cpu_mean, cpu_rstd] =
      at::native_layer_norm(cpu_input, sizes.slice(sizes.size() - normalized_ndim), cpu_weight, cpu_bias, eps);
  glue::expectClose(glue::toCPU(out), cpu_out, "out");
  glue::expectClose(glue::toCPU(mean).view(cpu_mean.sizes()), cpu_mean, "mean");
  glue::expectClose(glue::toCPU(rstd).view(cpu_rstd.sizes()), cpu_rstd, "rstd");
}

// The cases of test/test_mps_parallel.py's layer norm comparison: one or two
// normalized dims, with and without affine parameters, a weight without a
// bias and a bias without a weight, two epsilons; and float16, which the
// graph computes in float32 and casts back.
TEST_F(GlueTest, LayerNormGraphPathMatchesTheCPU) {
  const Case cases[] = {
      {{4, 16, 64}, 1, true, true, 1e-5, at::kFloat},
      {{3, 8, 32}, 2, true, true, 1e-5, at::kFloat},
      {{2, 256}, 1, false, false, 1e-5, at::kFloat},
      {{8, 1024}, 1, true, true, 1e-3, at::kFloat},
      {{5, 48}, 1, true, false, 1e-5, at::kFloat},
      {{5, 48}, 1, false, true, 1e-5, at::kFloat},
      {{4, 16, 64}, 1, true, true, 1e-5, at::kHalf},
      {{3, 8, 32}, 2, false, true, 1e-5, at::kHalf},
  };
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

} // namespace
