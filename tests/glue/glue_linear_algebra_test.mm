// Ops of LinearAlgebra.mm, checked for how they record their buffers with
// the dependency tracker: the Metal-kernel matrix products (do_metal_mm,
// do_metal_addmm, do_metal_bmm), which mm, addmm and bmm take for integer
// tensors, with PYTORCH_MPS_PREFER_METAL, and before macOS 14.4 for
// dimensions over 2**15, with bodies the tests define in the bundled shader
// library; and the tiled bmm, linalg.solve_triangular, linalg.lu_factor and
// linalg.solve, which encode Apple's kernels (Note [simulated MPSNDArray],
// Note [simulated MPSMatrix]) in a pass of their own.

#include "GlueTest.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/linalg_lu_factor.h>
#include <ATen/ops/linalg_solve.h>
#include <ATen/ops/linalg_solve_triangular.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/Scalar.h>
#include <c10/core/StreamGuard.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

// Static, or in an anonymous namespace, in LinearAlgebra.mm; the build's
// copies of them (extract_function.py) have external linkage.
namespace at::native::mps {
Tensor& do_metal_mm(const Tensor& self, const Tensor& other, Tensor& output);
Tensor& do_metal_bmm(const Tensor& batch1, const Tensor& batch2, Tensor& output);
Tensor& do_metal_addmm(const Tensor& self,
                       const Tensor& other,
                       Tensor& output,
                       const Scalar& alpha,
                       const Scalar& beta,
                       const Tensor& bias);
Tensor& tiled_bmm_out_mps_impl(const Tensor& batch1, const Tensor& batch2, Tensor& result);
Tensor& linalg_solve_triangular_mps_impl(const Tensor& A,
                                         const Tensor& B,
                                         bool upper,
                                         bool transpose,
                                         bool left,
                                         bool unitriangular,
                                         Tensor& out);
void linalg_lu_factor_ex_out_mps_impl(const Tensor& A,
                                      bool pivot,
                                      const Tensor& LU,
                                      const Tensor& pivots,
                                      const Tensor& info,
                                      bool check_errors);
void linalg_solve_out_mps_impl(const Tensor& A,
                               const Tensor& B,
                               bool left,
                               bool check_errors,
                               const Tensor& result,
                               const Tensor& LU,
                               const Tensor& pivots,
                               const Tensor& info);
} // namespace at::native::mps

namespace {

using glue::GlueTest;

constexpr int64_t kRows = 3, kInner = 4, kCols = 5, kBatch = 2;
constexpr int64_t kAlpha = 2, kBeta = 3;

// Declared with their operands `constant`, as their bodies only read them
// (the hazard detector counts what a body does); the arguments after the
// buffers are setBytes constants.
constexpr const char* kMatmulLibrary =
    "kernel void matmul_long(constant long* mat1, constant long* mat2, device long* output, "
    "constant long* strides, constant uint* sizes) {}\n"
    "kernel void addmm_long(constant long* mat1, constant long* mat2, device long* output, constant long* bias, "
    "constant long* alpha_beta, constant long* strides, constant uint* sizes) {}\n"
    "kernel void naive_bmm_long(constant long* mat1, constant long* mat2, device long* output, "
    "constant long* strides, constant uint* sizes) {}\n";

// out[b] = a[b] @ m[b] (+ bias, scaled) for `batches` contiguous products of
// kRows x kInner and kInner x kCols; the ops pass the sizes as constants,
// which the simulator does not keep.
void multiply(const std::vector<sim::BufferPtr>& buffers, int64_t batches, bool addmm) {
  const auto* a = reinterpret_cast<const int64_t*>(buffers.at(0)->contents());
  const auto* m = reinterpret_cast<const int64_t*>(buffers.at(1)->contents());
  auto* out = reinterpret_cast<int64_t*>(buffers.at(2)->contents());
  const auto* bias = addmm ? reinterpret_cast<const int64_t*>(buffers.at(3)->contents()) : nullptr;
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) {
        int64_t sum = 0;
        for (int64_t k = 0; k < kInner; ++k) {
          sum += a[(b * kRows + i) * kInner + k] * m[(b * kInner + k) * kCols + j];
        }
        out[(b * kRows + i) * kCols + j] = addmm ? kAlpha * sum + kBeta * bias[i * kCols + j] : sum;
      }
    }
  }
}

void defineMatmulKernels() {
  sim::metal::setBundledShaderSource(kMatmulLibrary);
  sim::metal::defineKernel("matmul_long", [](const auto& buffers) { multiply(buffers, 1, false); });
  sim::metal::defineKernel("addmm_long", [](const auto& buffers) { multiply(buffers, 1, true); });
  sim::metal::defineKernel("naive_bmm_long", [](const auto& buffers) { multiply(buffers, kBatch, false); });
}

at::Tensor randomLongs(at::IntArrayRef sizes) {
  return at::randint(-9, 10, sizes, at::kLong);
}

// One thread's inputs and the CPU's products of them with the shared
// operands, made before the threads start (see glue_linear_test.mm's
// SharedModel).
struct Products {
  Products(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& batch_weight)
      : input(randomLongs({kRows, kInner})),
        batch(randomLongs({kBatch, kRows, kInner})),
        mm(at::mm(input, weight)),
        addmm(at::addmm(bias, input, weight, kBeta, kAlpha)),
        bmm(at::bmm(batch, batch_weight)) {}
  at::Tensor input, batch, mm, addmm, bmm;
};

// Eight threads multiply their own inputs by one weight (and add one bias)
// on their own streams, as threads sharing a model do, with each of the
// three kernels: the CPU's results, and no cross-stream wait, as the weight
// and bias are bound as reads. With mm's operands bound as writes, the
// tracker counted 73 to 77 waits; with bmm's, or addmm's bias, 39; with
// addmm's weight, 51, and threads raised "neither can go first".
TEST_F(GlueTest, MetalMatrixProductsOnManyStreamsShareTheirWeightWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 5;
  defineMatmulKernels();
  const at::Tensor cpu_weight = randomLongs({kInner, kCols}), cpu_bias = randomLongs({kRows, kCols});
  const at::Tensor cpu_batch_weight = randomLongs({kBatch, kInner, kCols});
  std::vector<Products> expected;
  for (int i = 0; i < kThreads * kRounds; ++i) {
    expected.emplace_back(cpu_weight, cpu_bias, cpu_batch_weight);
  }
  const at::Tensor weight = glue::toMPS(cpu_weight), bias = glue::toMPS(cpu_bias);
  const at::Tensor batch_weight = glue::toMPS(cpu_batch_weight);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int t) {
    for (int r = 0; r < kRounds; ++r) {
      const Products& want = expected[t * kRounds + r];
      const at::Tensor input = glue::toMPS(want.input), batch = glue::toMPS(want.batch);
      at::Tensor mm = glue::toMPS(at::empty_like(want.mm));
      at::Tensor addmm = glue::toMPS(at::empty_like(want.addmm));
      at::Tensor bmm = glue::toMPS(at::empty_like(want.bmm));
      @autoreleasepool {
        at::native::mps::do_metal_mm(input, weight, mm);
        at::native::mps::do_metal_addmm(input, weight, addmm, kAlpha, kBeta, bias);
        at::native::mps::do_metal_bmm(batch, batch_weight, bmm);
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_TRUE(glue::toCPU(mm).equal(want.mm));
      EXPECT_TRUE(glue::toCPU(addmm).equal(want.addmm));
      EXPECT_TRUE(glue::toCPU(bmm).equal(want.bmm));
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

// On stream 1, a kernel leaves its compute pass open and then `op` writes
// `result` (an MPS tensor), ending that pass and encoding its own; on
// stream 2, a kernel copies `result`. The copy must wait for `op`'s pass,
// not only the pass before it: it must hold `expected` (the CPU's), and the
// two streams must not touch `result` at once. The products and solves are
// large enough (256 x 256, in double precision on the simulated GPU) that a
// copy which waited for the earlier pass alone runs while they compute.
void expectAnotherStreamsReadWaitsForThePassOf(const std::function<void()>& op,
                                               const at::Tensor& result,
                                               const at::Tensor& expected) {
  const at::Tensor copy = glue::toMPS(at::zeros_like(expected));
  at::mps::MPSStream* first = at::mps::getMPSStream(1);
  at::mps::MPSStream* second = at::mps::getMPSStream(2);
  {
    c10::StreamGuard guard(first->unwrap());
    const at::Tensor scratch = glue::mpsTensor(8);
    glue::encodeKernel({glue::bufferOf(scratch)}, [] {});
    @autoreleasepool {
      op();
    }
    first->synchronize(at::mps::SyncType::COMMIT);
  }
  {
    c10::StreamGuard guard(second->unwrap());
    glue::encodeCopy(glue::bufferOf(result), glue::bufferOf(copy));
    second->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  }
  first->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  EXPECT_TRUE(at::allclose(glue::toCPU(copy), expected, 1e-3, 1e-3));
}

// The tiled bmm (MPSNDArrayMatrixMultiplication, which bmm takes for
// outputs of more than 2**32 elements) ends the open pass and encodes in a
// pass of its own. With its uses recorded before that, 6 of 6 runs copied
// the old result, and the hazard detector reported the overlap. It also
// leaked its kernel object on every call (LeakSanitizer, in the asan
// variant), which it now autoreleases.
TEST_F(GlueTest, TiledBmmOrdersAnotherStreamsReadAfterItsOwnPass) {
  at::manual_seed(5);
  const at::Tensor cpu_a = at::randn({1, 256, 256}), cpu_b = at::randn({1, 256, 256});
  const at::Tensor expected = at::bmm(cpu_a, cpu_b);
  const at::Tensor a = glue::toMPS(cpu_a), b = glue::toMPS(cpu_b);
  at::Tensor result = glue::toMPS(at::zeros_like(expected));
  expectAnotherStreamsReadWaitsForThePassOf(
      [&] { at::native::mps::tiled_bmm_out_mps_impl(a, b, result); }, result, expected);
}

// linalg.solve_triangular (MPSMatrixSolveTriangular, Note [simulated
// MPSMatrix]) ends the open pass too and encodes the solve after it. With
// its uses recorded before that, 6 of 6 runs copied the old result.
TEST_F(GlueTest, SolveTriangularOrdersAnotherStreamsReadAfterItsOwnPass) {
  at::manual_seed(6);
  // Well conditioned: a unit-scale upper triangle over a dominant diagonal.
  const at::Tensor cpu_a = at::randn({256, 256}).triu() / 16 + at::eye(256) * 4;
  const at::Tensor cpu_b = at::randn({256, 256});
  const at::Tensor expected = at::linalg_solve_triangular(cpu_a, cpu_b, /*upper=*/true);
  const at::Tensor a = glue::toMPS(cpu_a), b = glue::toMPS(cpu_b);
  at::Tensor result = glue::toMPS(at::zeros_like(expected));
  expectAnotherStreamsReadWaitsForThePassOf(
      [&] {
        at::native::mps::linalg_solve_triangular_mps_impl(
            a, b, /*upper=*/true, /*transpose=*/false, /*left=*/true, /*unitriangular=*/false, result);
      },
      result,
      expected);
}

// Eight threads solve one system for one right-hand side on their own
// streams, as threads sharing a model's matrices do: the CPU's solution,
// and no cross-stream wait, as the solve copies A into its own LU and binds
// B as a read. With B bound as a write, the tracker counted 23 waits.
TEST_F(GlueTest, LinearSolveOnManyStreamsSharesItsOperandsWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 3;
  constexpr int64_t kOrder = 16;
  at::manual_seed(7);
  const at::Tensor cpu_a = at::randn({kOrder, kOrder}) + at::eye(kOrder) * kOrder;
  const at::Tensor cpu_b = at::randn({kOrder, 2});
  const at::Tensor expected = at::linalg_solve(cpu_a, cpu_b);
  const at::Tensor a = glue::toMPS(cpu_a), b = glue::toMPS(cpu_b);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int) {
    for (int r = 0; r < kRounds; ++r) {
      const at::Tensor result = glue::toMPS(at::zeros_like(expected)), lu = glue::toMPS(at::zeros_like(cpu_a));
      const at::Tensor pivots = glue::toMPS(at::zeros({kOrder}, at::kInt)), info = glue::toMPS(at::zeros({}, at::kInt));
      @autoreleasepool {
        at::native::mps::linalg_solve_out_mps_impl(
            a, b, /*left=*/true, /*check_errors=*/false, result, lu, pivots, info);
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_TRUE(at::allclose(glue::toCPU(result), expected, 1e-4, 1e-4));
      EXPECT_EQ(glue::toCPU(info).item<int>(), 0);
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

constexpr int64_t kLargeOrder = 128;

// Threads sharing one stream, as threads beyond the pool's worker streams
// do: while this thread runs `op` on stream 1 in each of 40 rounds, another
// thread keeps encoding kernels there, ending its pass every other time and
// else leaving its encoder open for the next op to end. `op` returns its
// outputs with the CPU's values for them; stream 2 copies the first, a
// float matrix of kLargeOrder rows and columns that Apple's kernel wrote.
// The copy must wait for the pass that kernel is encoded in: it must hold
// the output, and the two streams must not touch it at once. Matrices this
// large keep the kernel running while a copy that waited for too early a
// pass would run. The CPU's values are computed in double precision, as the
// simulated kernels compute: float LAPACK's LU of a random matrix this large
// can differ from it by more than the tolerance.
using Outputs = std::vector<std::pair<at::Tensor, at::Tensor>>;
void expectOrderedOnASharedStream(const std::function<Outputs()>& op) {
  constexpr int kRounds = 40;
  at::mps::MPSStream* shared = at::mps::getMPSStream(1);
  at::mps::MPSStream* reader = at::mps::getMPSStream(2);
  c10::StreamGuard guard(shared->unwrap());
  glue::OtherThreadOnStream other(shared, [shared](int i) {
    // Held for a while, so that the op's thread often waits here.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    while (std::chrono::steady_clock::now() < until) {
    }
    if (i % 2 == 0) {
      shared->endKernelCoalescing();
    }
  });
  int stale = 0;
  for (int r = 0; r < kRounds; ++r) {
    // Made before the op: toMPS() waits for the stream's work.
    const at::Tensor copy = glue::toMPS(at::zeros({kLargeOrder, kLargeOrder}));
    Outputs outputs;
    @autoreleasepool {
      outputs = op();
    }
    const at::Tensor result = outputs.at(0).first;
    shared->synchronize(at::mps::SyncType::COMMIT);
    {
      c10::StreamGuard reader_guard(reader->unwrap());
      glue::encodeCopy(glue::bufferOf(result), glue::bufferOf(copy));
      reader->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    }
    shared->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    for (const auto& [output, expected] : outputs) {
      EXPECT_TRUE(at::allclose(glue::toCPU(output), expected, 1e-4, 1e-4));
    }
    stale += glue::toCPU(copy).equal(glue::toCPU(result)) ? 0 : 1;
  }
  EXPECT_EQ(stale, 0) << "of " << kRounds << " rounds";
}

// With the uses recorded before the serial section (as v2.9.1 does), 29 to
// 37 of 40 rounds copied a stale factor, in each of 10 runs; without ending
// the coalesced encoder first, the simulator stopped at the open encoder.
TEST_F(GlueTest, LuFactorOnASharedStreamIsOrderedWithAnotherStreamsRead) {
  expectOrderedOnASharedStream([] {
    const at::Tensor cpu = at::randn({kLargeOrder, kLargeOrder});
    const auto [cpu_lu, cpu_pivots] = at::linalg_lu_factor(cpu.to(at::kDouble));
    const at::Tensor a = glue::toMPS(cpu), lu = glue::toMPS(at::zeros_like(cpu));
    const at::Tensor pivots = glue::toMPS(at::zeros({kLargeOrder}, at::kInt));
    const at::Tensor info = glue::toMPS(at::zeros({}, at::kInt));
    at::native::mps::linalg_lu_factor_ex_out_mps_impl(a, /*pivot=*/true, lu, pivots, info, /*check_errors=*/false);
    return Outputs{{lu, cpu_lu.to(at::kFloat)}, {pivots, cpu_pivots}};
  });
}

// So broken, 1 to 30 of 40 rounds copied a stale solution (10 of 10 runs).
TEST_F(GlueTest, LinearSolveOnASharedStreamIsOrderedWithAnotherStreamsRead) {
  expectOrderedOnASharedStream([] {
    const at::Tensor cpu_a = at::randn({kLargeOrder, kLargeOrder}) + at::eye(kLargeOrder) * kLargeOrder;
    const at::Tensor cpu_b = at::randn({kLargeOrder, kLargeOrder});
    const at::Tensor a = glue::toMPS(cpu_a), b = glue::toMPS(cpu_b);
    const at::Tensor result = glue::toMPS(at::zeros_like(cpu_b)), lu = glue::toMPS(at::zeros_like(cpu_a));
    const at::Tensor pivots = glue::toMPS(at::zeros({kLargeOrder}, at::kInt));
    const at::Tensor info = glue::toMPS(at::zeros({}, at::kInt));
    at::native::mps::linalg_solve_out_mps_impl(a, b, /*left=*/true, /*check_errors=*/false, result, lu, pivots, info);
    return Outputs{{result, at::linalg_solve(cpu_a.to(at::kDouble), cpu_b.to(at::kDouble)).to(at::kFloat)}};
  });
}

} // namespace
