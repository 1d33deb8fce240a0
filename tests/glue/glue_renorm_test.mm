// RenormKernel.mm's renorm (torch.renorm) on a stream that threads share.
// The norm and the product around its Metal kernel are the glue's stand-in
// kernels; the kernel's body is the test's, in the bundled shader library.

#include "GlueTest.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/renorm.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/Scalar.h>
#include <c10/core/StreamGuard.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// In an anonymous namespace in RenormKernel.mm; the build's copy of it
// (extract_function.py) has external linkage.
namespace at::native::mps {
void renorm_out_mps(const Tensor& self, const Scalar& p, int64_t dim, const Scalar& maxnorm, const Tensor& out);
} // namespace at::native::mps

namespace {

using glue::GlueTest;

// The bound is a constant (setBytes), which the simulator does not keep.
constexpr const char* kRenormLibrary =
    "kernel void renorm_float(constant float* norm, device float* factor, constant float& maxnorm) {}\n";

// Rows of 128 entries of standard deviation 3 have norms near
// 3 * sqrt(128) = 34: this bound scales some of them and leaves others.
constexpr int64_t kRows = 16, kColumns = 128;
constexpr float kMaxNorm = 34;

// Threads sharing one stream, as threads beyond the pool's worker streams
// do: in each of 40 rounds this thread renorms the rows of a new matrix,
// while another thread encodes kernels there and ends each one's encoder.
// The CPU's values in every round. With the
// encoder taken before the serial section, as v2.9.1 takes it, the other
// thread ended that encoder before the op's kernel used it.
TEST_F(GlueTest, RenormOnASharedStreamTakesItsEncoderInItsSerialSection) {
  constexpr int kRounds = 40;
  sim::metal::setBundledShaderSource(kRenormLibrary);
  sim::metal::defineKernel("renorm_float", [](const std::vector<sim::BufferPtr>& buffers) {
    const float* norm = glue::elements<float>(buffers.at(0));
    float* factor = glue::elements<float>(buffers.at(1));
    for (int64_t i = 0; i < kRows; ++i) {
      factor[i] = norm[i] > kMaxNorm ? kMaxNorm / (norm[i] + 1e-7f) : 1.0f;
    }
  });
  at::mps::MPSStream* shared = at::mps::getMPSStream(1);
  c10::StreamGuard guard(shared->unwrap());
  glue::OtherThreadOnStream other(shared, [shared](int) { shared->endKernelCoalescing(); });
  for (int r = 0; r < kRounds; ++r) {
    const at::Tensor cpu = at::randn({kRows, kColumns}) * 3;
    const at::Tensor out = glue::toMPS(at::zeros_like(cpu));
    @autoreleasepool {
      at::native::mps::renorm_out_mps(glue::toMPS(cpu), /*p=*/2, /*dim=*/0, kMaxNorm, out);
    }
    shared->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    glue::expectClose(glue::toCPU(out), at::renorm(cpu, /*p=*/2, /*dim=*/0, kMaxNorm), "renorm");
  }
}

// A bound that a float cannot hold fails the conversion in the kernel's
// serial section: the error reaches the caller. Raised through
// dispatch_sync, as v2.9.1 dispatches, it could not leave libdispatch and
// ended the process.
TEST_F(GlueTest, RenormWithABoundBeyondFloatRaisesAnError) {
  sim::metal::setBundledShaderSource(kRenormLibrary);
  const at::Tensor self = glue::toMPS(at::randn({kRows, kColumns}));
  const at::Tensor out = glue::toMPS(at::zeros({kRows, kColumns}));
  try {
    @autoreleasepool {
      at::native::mps::renorm_out_mps(self, /*p=*/2, /*dim=*/0, /*maxnorm=*/1e300, out);
    }
    ADD_FAILURE() << "renorm accepted a bound beyond float";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("without overflow"), std::string::npos) << e.what();
  }
}

} // namespace
