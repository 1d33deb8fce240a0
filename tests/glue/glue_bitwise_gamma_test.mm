// BitwiseOps.mm's and, or and xor of two tensors, and Gamma.mm's lgamma,
// digamma and polygamma, on threads that share their inputs. Both files
// build whole; their kernels' bodies are the test's: BitwiseOps.mm's in the
// library it compiles from its own source, Gamma.mm's in the bundled one.

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/digamma.h>
#include <ATen/ops/lgamma.h>
#include <ATen/ops/polygamma.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

using glue::GlueTest;

constexpr int64_t kElements = 64;
constexpr int64_t kPolygammaOrder = 2;

// The polygamma kernel's order is a constant (setBytes), which the
// simulator does not keep; the body knows it.
constexpr const char* kGammaLibrary =
    "kernel void lgamma_float_float(constant float* input, device float* output) {}\n"
    "kernel void digamma_float_float(constant float* input, device float* output) {}\n"
    "kernel void polygamma_float_float(constant float* input, device float* output) {}\n";

// Bodies over kElements elements: out = f(in) for Gamma.mm's kernels (input
// first), computed by the CPU's op in double precision, as the simulated GPU
// computes; out = a op b for BitwiseOps.mm's (output first). The C library's
// lgamma, which the CPU's ops call, writes the global signgam: the bodies,
// which run on the queues' threads at once, take turns, and the test's
// threads compare with values computed before they start.
std::mutex gamma_mu;
void defineUnary(const char* name, std::function<at::Tensor(const at::Tensor&)> f) {
  sim::metal::defineKernel(name, [f = std::move(f)](const std::vector<sim::BufferPtr>& buffers) {
    const at::Tensor in = glue::floats(buffers.at(0), {kElements});
    const at::Tensor out = glue::floats(buffers.at(1), {kElements});
    std::lock_guard<std::mutex> lock(gamma_mu);
    out.copy_(f(in.to(at::kDouble)));
  });
}

void defineBinary(const char* name, int64_t (*op)(int64_t, int64_t)) {
  sim::metal::defineKernel(name, [op](const std::vector<sim::BufferPtr>& buffers) {
    int64_t* out = glue::elements<int64_t>(buffers.at(0));
    const int64_t* a = glue::elements<int64_t>(buffers.at(1));
    const int64_t* b = glue::elements<int64_t>(buffers.at(2));
    for (int64_t i = 0; i < kElements; ++i) {
      out[i] = op(a[i], b[i]);
    }
  });
}

at::Tensor polygammaOf(const at::Tensor& x) {
  return at::polygamma(kPolygammaOrder, x);
}

void defineKernels() {
  sim::metal::setBundledShaderSource(kGammaLibrary);
  defineUnary("lgamma_float_float", [](const at::Tensor& x) { return at::lgamma(x); });
  defineUnary("digamma_float_float", [](const at::Tensor& x) { return at::digamma(x); });
  defineUnary("polygamma_float_float", polygammaOf);
  defineBinary("bitwise_and_tensor_tensor", [](int64_t a, int64_t b) { return a & b; });
  defineBinary("bitwise_or_tensor_tensor", [](int64_t a, int64_t b) { return a | b; });
  defineBinary("bitwise_xor_tensor_tensor", [](int64_t a, int64_t b) { return a ^ b; });
}

// Eight threads take the and, or and xor of two shared tensors, and lgamma,
// digamma and polygamma of a third, five times each, as threads sharing a
// model's masks and inputs do: the CPU's values, and no cross-stream wait,
// as the kernels bind what they read as reads.
TEST_F(GlueTest, BitwiseAndGammaOpsOnManyStreamsShareTheirInputsWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 5;
  defineKernels();
  const at::Tensor cpu_a = at::randint(0, 1 << 20, {kElements}, at::kLong);
  const at::Tensor cpu_b = at::randint(0, 1 << 20, {kElements}, at::kLong);
  const at::Tensor cpu_x = at::rand({kElements}) * 4 + 1;
  const at::Tensor a = glue::toMPS(cpu_a), b = glue::toMPS(cpu_b), x = glue::toMPS(cpu_x);
  const at::Tensor want_and = at::bitwise_and(cpu_a, cpu_b), want_or = at::bitwise_or(cpu_a, cpu_b),
                   want_xor = at::bitwise_xor(cpu_a, cpu_b);
  const at::Tensor want_lgamma = at::lgamma(cpu_x.to(at::kDouble)).to(at::kFloat),
                   want_digamma = at::digamma(cpu_x.to(at::kDouble)).to(at::kFloat),
                   want_polygamma = polygammaOf(cpu_x.to(at::kDouble)).to(at::kFloat);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int) {
    for (int r = 0; r < kRounds; ++r) {
      const at::Tensor and_ = glue::toMPS(at::zeros_like(cpu_a)), or_ = glue::toMPS(at::zeros_like(cpu_a)),
                       xor_ = glue::toMPS(at::zeros_like(cpu_a));
      const at::Tensor lgamma = glue::toMPS(at::zeros_like(cpu_x)), digamma = glue::toMPS(at::zeros_like(cpu_x)),
                       polygamma = glue::toMPS(at::zeros_like(cpu_x));
      @autoreleasepool {
        glue::Into<at::native::structured_bitwise_and_out_mps>(and_).impl(a, b, and_);
        glue::Into<at::native::structured_bitwise_or_out_mps>(or_).impl(a, b, or_);
        glue::Into<at::native::structured_bitwise_xor_out_mps>(xor_).impl(a, b, xor_);
        glue::Into<at::native::structured_lgamma_out_mps>(lgamma).impl(x, lgamma);
        glue::Into<at::native::structured_digamma_out_mps>(digamma).impl(x, digamma);
        glue::Into<at::native::structured_polygamma_out_mps>(polygamma).impl(kPolygammaOrder, x, polygamma);
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_TRUE(glue::toCPU(and_).equal(want_and));
      EXPECT_TRUE(glue::toCPU(or_).equal(want_or));
      EXPECT_TRUE(glue::toCPU(xor_).equal(want_xor));
      glue::expectClose(glue::toCPU(lgamma), want_lgamma, "lgamma");
      glue::expectClose(glue::toCPU(digamma), want_digamma, "digamma");
      glue::expectClose(glue::toCPU(polygamma), want_polygamma, "polygamma");
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

// An error raised in an op's serial section reaches its caller: here the
// binding's check of an operand left on the CPU, which the ops' callers
// (TensorIterator) never pass. v2.9.1 dispatches these kernels with
// dispatch_sync, through which the error could not return: the process
// ended.
TEST_F(GlueTest, BitwiseAndGammaErrorsInTheirSerialSectionReachTheCaller) {
  defineKernels();
  const at::Tensor on_cpu = at::randint(0, 8, {kElements}, at::kLong);
  const at::Tensor mps = glue::toMPS(on_cpu), out = glue::toMPS(at::zeros_like(on_cpu));
  const at::Tensor x_on_cpu = at::rand({kElements}), y = glue::toMPS(at::zeros_like(x_on_cpu));
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"bitwise_and", [&] { glue::Into<at::native::structured_bitwise_and_out_mps>(out).impl(mps, on_cpu, out); }},
      {"lgamma", [&] { glue::Into<at::native::structured_lgamma_out_mps>(y).impl(x_on_cpu, y); }},
      {"digamma", [&] { glue::Into<at::native::structured_digamma_out_mps>(y).impl(x_on_cpu, y); }},
      {"polygamma",
       [&] { glue::Into<at::native::structured_polygamma_out_mps>(y).impl(kPolygammaOrder, x_on_cpu, y); }},
  };
  for (const auto& [name, call] : calls) {
    try {
      @autoreleasepool {
        call();
      }
      ADD_FAILURE() << name << " accepted an operand on the CPU";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("Passed CPU tensor to MPS op"), std::string::npos)
          << name << ": " << e.what();
    }
  }
}

} // namespace
