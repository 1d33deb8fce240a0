// UpSample.mm's Metal-kernel templates (which bilinear, bicubic and their
// anti-aliased forms, linear, trilinear and 3-D nearest upsampling take) on
// threads that share one tensor, as a model interpolating its positional
// embedding to each input's size does. The kernels' bodies are the test's,
// in the bundled shader library: each scales by two as nearest-neighbour
// upsampling does, which the CPU's upsample_nearest computes.

#include "GlueTest.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/upsample_nearest2d.h>
#include <ATen/ops/upsample_nearest3d.h>
#include <ATen/ops/zeros_like.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// Static in UpSample.mm; the build's copies of them (extract_function.py)
// have external linkage.
namespace at::native::mps {
void upsample_kernel_out_template(const Tensor& input,
                                  IntArrayRef output_size,
                                  bool align_corners,
                                  std::optional<double> scale_h_opt,
                                  std::optional<double> scale_w_opt,
                                  const Tensor& output,
                                  const std::string& name);
void upsample_kernel_out_template(const Tensor& input,
                                  IntArrayRef output_size,
                                  bool align_corners,
                                  std::optional<double> scale_d_opt,
                                  std::optional<double> scale_h_opt,
                                  std::optional<double> scale_w_opt,
                                  const Tensor& output,
                                  const std::string& name);
void upsample_kernel_backward_out_template(const Tensor& grad_input,
                                           const Tensor& grad_output,
                                           IntArrayRef output_size,
                                           IntArrayRef input_size,
                                           bool align_corners,
                                           std::optional<double> scale_h_opt,
                                           std::optional<double> scale_w_opt,
                                           const std::string& name);
} // namespace at::native::mps

namespace {

using glue::GlueTest;

// Channels, then each spatial size of the smaller tensor.
constexpr int64_t kChannels = 3, kSide = 4;

// The sizes, strides and scales are constants (setBytes), which the
// simulator does not keep; the bodies know them.
constexpr const char* kUpsampleLibrary =
    "kernel void upsample_bicubic2d_float(constant float* input, device float* output) {}\n"
    "kernel void upsample_trilinear_float(constant float* input, device float* output) {}\n"
    "kernel void upsample_bicubic2d_backward_float(device float* grad_input, constant float* grad_output) {}\n";

// Element (c, z, y, x) of `dims` spatial dimensions, each `side` long.
int64_t at3(int64_t c, int64_t z, int64_t y, int64_t x, int64_t side, int dims) {
  return ((c * (dims == 3 ? side : 1) + z) * side + y) * side + x;
}

// small[c][z][y][x] and big[c][2z + i][2y + j][2x + k], for every element of
// small and i, j, k in {0, 1} (i only in 3-D): what `f` does with each pair.
template <typename F>
void forEachPair(int dims, F f) {
  for (int64_t c = 0; c < kChannels; ++c) {
    for (int64_t z = 0; z < (dims == 3 ? kSide : 1); ++z) {
      for (int64_t y = 0; y < kSide; ++y) {
        for (int64_t x = 0; x < kSide; ++x) {
          for (int64_t i = 0; i < (dims == 3 ? 2 : 1); ++i) {
            for (int64_t j = 0; j < 2; ++j) {
              for (int64_t k = 0; k < 2; ++k) {
                f(at3(c, z, y, x, kSide, dims),
                  at3(c, dims == 3 ? 2 * z + i : 0, 2 * y + j, 2 * x + k, 2 * kSide, dims));
              }
            }
          }
        }
      }
    }
  }
}

void defineUpsampleKernels() {
  sim::metal::setBundledShaderSource(kUpsampleLibrary);
  for (int dims : {2, 3}) {
    sim::metal::defineKernel(dims == 2 ? "upsample_bicubic2d_float" : "upsample_trilinear_float",
                             [dims](const std::vector<sim::BufferPtr>& buffers) {
                               const float* in = glue::elements<float>(buffers.at(0));
                               float* out = glue::elements<float>(buffers.at(1));
                               forEachPair(dims, [&](int64_t s, int64_t b) { out[b] = in[s]; });
                             });
  }
  sim::metal::defineKernel("upsample_bicubic2d_backward_float", [](const std::vector<sim::BufferPtr>& buffers) {
    float* grad_input = glue::elements<float>(buffers.at(0));
    const float* grad_output = glue::elements<float>(buffers.at(1));
    forEachPair(2, [&](int64_t s, int64_t b) { grad_input[s] += grad_output[b]; });
  });
}

// Eight threads upsample one shared tensor in 2-D and 3-D, and take the
// 2-D backward of one shared gradient, into tensors of their own, five
// times each: the CPU's results, and no cross-stream wait, as the kernels
// bind the tensor they read as a read. With all three bound as writes, as
// v2.9.1 binds them, the tracker counted 109 to 112 waits; with any one of
// them, 39 (3 of 3 runs each).
TEST_F(GlueTest, UpsamplingOnManyStreamsSharesItsInputWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 5;
  defineUpsampleKernels();
  const at::Tensor cpu_image = at::randn({1, kChannels, kSide, kSide});
  const at::Tensor cpu_volume = at::randn({1, kChannels, kSide, kSide, kSide});
  const at::Tensor cpu_grad = at::randn({1, kChannels, 2 * kSide, 2 * kSide});
  const at::Tensor image_expected = at::upsample_nearest2d(cpu_image, {2 * kSide, 2 * kSide});
  const at::Tensor volume_expected = at::upsample_nearest3d(cpu_volume, {2 * kSide, 2 * kSide, 2 * kSide});
  const at::Tensor grad_expected = cpu_grad.view({1, kChannels, kSide, 2, kSide, 2}).sum({3, 5});
  const at::Tensor image = glue::toMPS(cpu_image), volume = glue::toMPS(cpu_volume), grad = glue::toMPS(cpu_grad);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int) {
    for (int r = 0; r < kRounds; ++r) {
      const at::Tensor image_out = glue::toMPS(at::zeros_like(image_expected));
      const at::Tensor volume_out = glue::toMPS(at::zeros_like(volume_expected));
      const at::Tensor grad_in = glue::toMPS(at::zeros_like(grad_expected));
      @autoreleasepool {
        at::native::mps::upsample_kernel_out_template(
            image, {2 * kSide, 2 * kSide}, false, std::nullopt, std::nullopt, image_out, "bicubic2d");
        at::native::mps::upsample_kernel_out_template(volume,
                                                      {2 * kSide, 2 * kSide, 2 * kSide},
                                                      false,
                                                      std::nullopt,
                                                      std::nullopt,
                                                      std::nullopt,
                                                      volume_out,
                                                      "trilinear");
        at::native::mps::upsample_kernel_backward_out_template(grad_in,
                                                               grad,
                                                               {2 * kSide, 2 * kSide},
                                                               {1, kChannels, kSide, kSide},
                                                               false,
                                                               std::nullopt,
                                                               std::nullopt,
                                                               "bicubic2d");
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      glue::expectClose(glue::toCPU(image_out), image_expected, "2-D upsampling");
      glue::expectClose(glue::toCPU(volume_out), volume_expected, "3-D upsampling");
      glue::expectClose(glue::toCPU(grad_in), grad_expected, "2-D upsampling's backward");
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

} // namespace
