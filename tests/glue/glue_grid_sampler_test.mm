// GridSampler.mm's 3-D sampler (grid_sampler_3d_mps, F.grid_sample on 5-D
// inputs), a Metal kernel, on threads that share its input and grid. The
// kernel's body is the test's, in the bundled shader library.

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>

#include <cstdint>
#include <vector>

namespace {

using glue::GlueTest;

// The sampler's parameters are a constant (setBytes), which the simulator
// does not keep.
constexpr const char* kGridSamplerLibrary =
    "kernel void grid_sampler_float(device float* output, constant float* input, constant float* grid) {}\n";

// What the test's kernel writes: each output element the sum of an input
// element and a grid coordinate, both taken round-robin. It reads every
// buffer the kernel binds, which is what the test is about; the sampling
// arithmetic is not.
void sample(const float* input, int64_t inputs, const float* grid, int64_t coordinates, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = input[i % inputs] + grid[i % coordinates];
  }
}

// Eight threads sample one volume at one grid, five times each, as threads
// sharing a model's fixed sampling grid do: the values the body computes,
// and no cross-stream wait, as the kernel binds the input and the grid as
// reads. With either or both bound as writes, as v2.9.1 binds them, the
// tracker counted 39 waits (3 of 3 runs each).
TEST_F(GlueTest, GridSampler3dOnManyStreamsSharesItsInputAndGridWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 5;
  const at::Tensor cpu_input = at::randn({1, 2, 3, 4, 4});
  const at::Tensor cpu_grid = at::rand({1, 2, 3, 3, 3}) * 2 - 1;
  at::Tensor expected = at::empty({1, 2, 2, 3, 3});
  sample(cpu_input.const_data_ptr<float>(),
         cpu_input.numel(),
         cpu_grid.const_data_ptr<float>(),
         cpu_grid.numel(),
         expected.mutable_data_ptr<float>(),
         expected.numel());
  sim::metal::setBundledShaderSource(kGridSamplerLibrary);
  // Sizes by value: the simulator keeps the body after the test.
  sim::metal::defineKernel("grid_sampler_float",
                           [inputs = cpu_input.numel(), coordinates = cpu_grid.numel(), n = expected.numel()](
                               const std::vector<sim::BufferPtr>& buffers) {
                             sample(glue::elements<float>(buffers.at(1)),
                                    inputs,
                                    glue::elements<float>(buffers.at(2)),
                                    coordinates,
                                    glue::elements<float>(buffers.at(0)),
                                    n);
                           });
  const at::Tensor input = glue::toMPS(cpu_input), grid = glue::toMPS(cpu_grid);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int) {
    for (int r = 0; r < kRounds; ++r) {
      at::Tensor out;
      @autoreleasepool {
        out = at::native::grid_sampler_3d_mps(input, grid, /*interpolation_mode=*/0, /*padding_mode=*/0, false);
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      glue::expectClose(glue::toCPU(out), expected, "grid_sampler_3d");
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

} // namespace
