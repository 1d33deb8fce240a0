// Attention.mm's Metal scaled-dot-product attention for short queries
// (_scaled_dot_product_attention_math_mps: one pass below 1024 keys, two
// passes from there), on threads that share the keys, values and mask, as
// requests decoding after one shared prompt do. The kernels' bodies are the
// test's, in the bundled shader library.

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using glue::elements;
using glue::GlueTest;

constexpr int64_t kHeads = 2, kDim = 64;

// The arguments after those the bodies use are constants (setBytes), which
// the simulator does not keep; the bodies know the shapes. The mask is the
// one-pass kernel's argument 9 and the first pass's argument 11.
constexpr const char* kAttentionLibrary =
    "kernel void sdpa_vector_float_64_64(constant float* q, constant float* k, constant float* v, "
    "device float* out, constant int& gqa, constant int& n, constant uint* head_strides, constant uint* seq_strides, "
    "constant float& scale, constant bool* mask, constant uint* mask_strides, constant bool& has_mask) {}\n"
    "kernel void sdpa_vector_2pass_1_float_64_64(constant float* q, constant float* k, constant float* v, "
    "device float* out, device float* sums, device float* maxs, constant int& gqa, constant int& n, "
    "constant uint* head_strides, constant uint* seq_strides, constant float& scale, constant bool* mask, "
    "constant uint* mask_strides, constant bool& has_mask) {}\n"
    "kernel void sdpa_vector_2pass_2_float_64(constant float* partials, constant float* sums, "
    "constant float* maxs, device float* out) {}\n";

// out[h] = softmax(q[h] k[h]^T / sqrt(kDim), masked) v[h] for one query per
// head and `keys` keys.
void attend(const float* q, const float* k, const float* v, const bool* mask, int64_t keys, float* out) {
  for (int64_t h = 0; h < kHeads; ++h) {
    std::vector<double> p(keys);
    double max = -INFINITY, sum = 0;
    for (int64_t s = 0; s < keys; ++s) {
      double dot = 0;
      for (int64_t d = 0; d < kDim; ++d) {
        dot += double(q[h * kDim + d]) * k[(h * keys + s) * kDim + d];
      }
      p[s] = mask[h * keys + s] ? dot / std::sqrt(double(kDim)) : -INFINITY;
      max = std::max(max, p[s]);
    }
    for (double& x : p) {
      x = std::exp(x - max);
      sum += x;
    }
    for (int64_t d = 0; d < kDim; ++d) {
      double acc = 0;
      for (int64_t s = 0; s < keys; ++s) {
        acc += p[s] / sum * v[(h * keys + s) * kDim + d];
      }
      out[h * kDim + d] = float(acc);
    }
  }
}

// The first pass writes the whole result as its partial result and the
// second copies it out: what each pass computes is the test's, what the
// test checks is where the buffers go.
void defineAttentionKernels(int64_t keys) {
  sim::metal::setBundledShaderSource(kAttentionLibrary);
  // q, k, v and the result are the first four buffers either way; the
  // mask is the one-pass kernel's fifth and the first pass's seventh.
  const auto attending = [keys](size_t mask) {
    return [keys, mask](const std::vector<sim::BufferPtr>& buffers) {
      attend(elements<float>(buffers.at(0)),
             elements<float>(buffers.at(1)),
             elements<float>(buffers.at(2)),
             elements<bool>(buffers.at(mask)),
             keys,
             elements<float>(buffers.at(3)));
    };
  };
  sim::metal::defineKernel("sdpa_vector_float_64_64", attending(4));
  sim::metal::defineKernel("sdpa_vector_2pass_1_float_64_64", attending(6));
  sim::metal::defineKernel("sdpa_vector_2pass_2_float_64", [](const std::vector<sim::BufferPtr>& buffers) {
    std::copy_n(elements<float>(buffers.at(0)), kHeads * kDim, elements<float>(buffers.at(3)));
  });
}

// Eight threads attend with queries of their own over one set of keys,
// values and boolean mask, five times each: the results attend() gives on
// the host (the CPU's attention runs OpenMP threads that ThreadSanitizer
// cannot follow), and no
// cross-stream wait, as the kernels bind q, k, v and the mask as reads.
// With q, k and v, or the mask alone, bound as writes in either path, that
// path's test counted 39 waits (3 of 3 runs each).
void expectSharedKeysNeedNoWaits(int64_t keys) {
  constexpr int kThreads = 8, kRounds = 5;
  defineAttentionKernels(keys);
  const at::Tensor cpu_k = at::randn({1, kHeads, keys, kDim}), cpu_v = at::randn({1, kHeads, keys, kDim});
  const at::Tensor cpu_mask = at::randint(0, 4, {1, kHeads, 1, keys}).ne(0);
  std::vector<at::Tensor> queries, expected;
  for (int i = 0; i < kThreads * kRounds; ++i) {
    queries.push_back(at::randn({1, kHeads, 1, kDim}));
    expected.push_back(at::empty({1, kHeads, 1, kDim}));
    attend(queries.back().const_data_ptr<float>(),
           cpu_k.const_data_ptr<float>(),
           cpu_v.const_data_ptr<float>(),
           cpu_mask.const_data_ptr<bool>(),
           keys,
           expected.back().mutable_data_ptr<float>());
  }
  const at::Tensor k = glue::toMPS(cpu_k), v = glue::toMPS(cpu_v), mask = glue::toMPS(cpu_mask);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int t) {
    for (int r = 0; r < kRounds; ++r) {
      const at::Tensor q = glue::toMPS(queries[t * kRounds + r]);
      at::Tensor out;
      @autoreleasepool {
        out = std::get<0>(at::native::_scaled_dot_product_attention_math_mps(
            q, k, v, mask, 0.0, /*is_causal=*/false, std::nullopt, std::nullopt));
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      glue::expectClose(glue::toCPU(out), expected[t * kRounds + r], "attention");
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

TEST_F(GlueTest, OnePassAttentionOnManyStreamsSharesItsKeysWithoutWaits) {
  expectSharedKeysNeedNoWaits(16);
}

TEST_F(GlueTest, TwoPassAttentionOnManyStreamsSharesItsKeysWithoutWaits) {
  expectSharedKeysNeedNoWaits(1024);
}

} // namespace
