// UpSample.mm's Metal-kernel templates (which bilinear, bicubic and their
// anti-aliased forms, linear, trilinear and 3-D nearest upsampling take) on
// threads that share one tensor, as a model interpolating its positional
// embedding to each input's size does. The kernels' bodies are the test's,
// in the bundled shader library: each runs the CPU's nearest-neighbour
// upsampling by two (its backward, the sum over each 2 x 2 block).

#include "GlueTest.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/upsample_nearest2d.h>
#include <ATen/ops/upsample_nearest3d.h>
#include <ATen/ops/zeros_like.h>

#include <array>
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

// The shapes the bodies see: an image and a volume, and both upsampled.
constexpr std::array<int64_t, 4> kImage{1, kChannels, kSide, kSide}, kImageUp{1, kChannels, 2 * kSide, 2 * kSide};
constexpr std::array<int64_t, 5> kVolume{1, kChannels, kSide, kSide, kSide};
constexpr std::array<int64_t, 5> kVolumeUp{1, kChannels, 2 * kSide, 2 * kSide, 2 * kSide};

// 2-D nearest upsampling's backward: each 2 x 2 block of the upsampled
// image summed into one element.
at::Tensor sumBlocks(const at::Tensor& upsampled) {
  return upsampled.view({1, kChannels, kSide, 2, kSide, 2}).sum({3, 5});
}

void defineUpsampleKernels() {
  sim::metal::setBundledShaderSource(kUpsampleLibrary);
  sim::metal::defineKernel("upsample_bicubic2d_float", [](const std::vector<sim::BufferPtr>& buffers) {
    glue::floats(buffers.at(1), kImageUp)
        .copy_(at::upsample_nearest2d(glue::floats(buffers.at(0), kImage), {2 * kSide, 2 * kSide}));
  });
  sim::metal::defineKernel("upsample_trilinear_float", [](const std::vector<sim::BufferPtr>& buffers) {
    glue::floats(buffers.at(1), kVolumeUp)
        .copy_(at::upsample_nearest3d(glue::floats(buffers.at(0), kVolume), {2 * kSide, 2 * kSide, 2 * kSide}));
  });
  sim::metal::defineKernel("upsample_bicubic2d_backward_float", [](const std::vector<sim::BufferPtr>& buffers) {
    glue::floats(buffers.at(0), kImage).copy_(sumBlocks(glue::floats(buffers.at(1), kImageUp)));
  });
}

// Eight threads upsample one shared tensor in 2-D and 3-D, and take the
// 2-D backward of one shared gradient, into tensors of their own, five
// times each: the CPU's results, and no cross-stream wait, as the kernels
// bind the tensor they read as a read. With all three bound as writes, as
// v2.9.1 binds them, the tracker counted 107 to 112 waits; with any one of
// them, 39 (3 of 3 runs each).
TEST_F(GlueTest, UpsamplingOnManyStreamsSharesItsInputWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 5;
  defineUpsampleKernels();
  const at::Tensor cpu_image = at::randn(kImage), cpu_volume = at::randn(kVolume), cpu_grad = at::randn(kImageUp);
  const at::Tensor image_expected = at::upsample_nearest2d(cpu_image, {2 * kSide, 2 * kSide});
  const at::Tensor volume_expected = at::upsample_nearest3d(cpu_volume, {2 * kSide, 2 * kSide, 2 * kSide});
  const at::Tensor grad_expected = sumBlocks(cpu_grad);
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
