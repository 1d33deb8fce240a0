// Indexing.mm's Metal-kernel ops on threads that share a model's tensors:
// masked_fill_ through one mask, index_copy of one source's rows into one
// tensor's, and advanced indexing (aten::index's kernel) with one index
// tensor, which the kernel reaches through an argument buffer; and
// Repeat.mm's repeat_interleave kernel, which binds raw buffers, between
// other streams' uses of them. The kernels' bodies are the test's, in the
// bundled shader library.

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/Scalar.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

// Static in Indexing.mm; the build's copy of it (extract_function.py) has
// external linkage.
namespace at::native::mps {
void index_kernel_mps(TensorIteratorBase& iter, IntArrayRef index_size, IntArrayRef index_stride);
} // namespace at::native::mps

// Repeat.mm's kernel, instantiated there by repeat_interleave_mps.
namespace at::native {
template <typename index_t>
void computeRepeatIndices(const index_t* repeat_ptr,
                          const int64_t* cumsum_ptr,
                          index_t* result_ptr,
                          int64_t size,
                          int64_t result_size);
} // namespace at::native

namespace {

using glue::elements;
using glue::GlueTest;

constexpr int64_t kRows = 8, kCols = 16, kElements = kRows * kCols, kPicked = 5;
constexpr int64_t kFill = -7;

// The arguments after the ones the bodies use are constants (setBytes),
// which the simulator does not keep; the bodies know the shapes above.
constexpr const char* kIndexingLibrary =
    "kernel void masked_fill_scalar_dense_64bit(device long* input, constant bool* mask, "
    "constant long& value) {}\n"
    "kernel void index_copy_dense_long_long(device long* out, constant long* self, constant long* source, "
    "constant long* index) {}\n"
    "kernel void index_select_64bit(device long* out, constant long* input) {}\n"
    "kernel void repeat_interleave_int64_t(constant long* repeat, constant long* cumsum, device long* result) {}\n";

constexpr int64_t kRepeated = 4;

void defineIndexingKernels() {
  sim::metal::setBundledShaderSource(kIndexingLibrary);
  sim::metal::defineKernel("masked_fill_scalar_dense_64bit", [](const auto& buffers) {
    for (int64_t i = 0; i < kElements; ++i) {
      if (elements<bool>(buffers.at(1))[i]) {
        elements<int64_t>(buffers.at(0))[i] = kFill;
      }
    }
  });
  sim::metal::defineKernel("index_copy_dense_long_long", [](const auto& buffers) {
    auto* out = elements<int64_t>(buffers.at(0));
    const auto* rows = elements<int64_t>(buffers.at(3));
    std::copy_n(elements<int64_t>(buffers.at(1)), kElements, out);
    for (int64_t k = 0; k < kPicked; ++k) {
      std::copy_n(elements<int64_t>(buffers.at(2)) + k * kCols, kCols, out + rows[k] * kCols);
    }
  });
  // The index tensor is the one buffer the kernel makes resident.
  sim::metal::defineKernel("index_select_64bit", [](const auto& buffers) {
    const auto* picked = elements<int64_t>(buffers.at(2));
    for (int64_t k = 0; k < kPicked; ++k) {
      elements<int64_t>(buffers.at(0))[k] = elements<int64_t>(buffers.at(1))[picked[k]];
    }
  });
  // Reads its inputs, takes a while, then writes: a use it is not ordered
  // with overlaps it.
  sim::metal::defineKernel("repeat_interleave_int64_t", [](const auto& buffers) {
    const std::vector<int64_t> repeats(elements<int64_t>(buffers.at(0)), elements<int64_t>(buffers.at(0)) + kRepeated);
    const std::vector<int64_t> ends(elements<int64_t>(buffers.at(1)), elements<int64_t>(buffers.at(1)) + kRepeated);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (int64_t i = 0; i < kRepeated; ++i) {
      std::fill(elements<int64_t>(buffers.at(2)) + ends[i] - repeats[i], elements<int64_t>(buffers.at(2)) + ends[i], i);
    }
  });
}

// What aten::index builds for input[index] with a 1-d input and index: the
// output, the input with the indexed dimension's stride 0, and the index.
void indexInto(at::Tensor& out, const at::Tensor& input, const at::Tensor& index) {
  const at::Tensor restrided = input.as_strided({kPicked}, {0});
  at::TensorIterator iter = at::TensorIteratorConfig()
                                .set_check_mem_overlap(false)
                                .check_all_same_dtype(false)
                                .add_output(out)
                                .add_const_input(restrided)
                                .add_const_input(index)
                                .build();
  at::native::mps::index_kernel_mps(iter, {kElements}, {input.element_size()});
}

// Eight threads read one mask, one source tensor and one index tensor
// through Indexing.mm's kernels, into tensors of their own, five times
// each, as threads sharing a model do: masked_fill_, index_copy (the
// shared tensor's rows replaced by the shared source's) and advanced
// indexing. The CPU's results, and no cross-stream wait, as every kernel
// records what it only reads as a read. With the mask bound as a write the
// tracker counted 39 waits; with index_copy's inputs, 76 to 80; with the
// index tensor recorded as written, 34 to 60, and threads raised "neither
// can go first".
TEST_F(GlueTest, IndexingKernelsOnManyStreamsReadSharedTensorsWithoutWaits) {
  constexpr int kThreads = 8, kRounds = 5;
  const at::Tensor cpu_mask = at::randint(0, 2, {kElements}, at::kLong).to(at::kBool);
  const at::Tensor cpu_self = at::randint(-9, 10, {kRows, kCols}, at::kLong);
  const at::Tensor cpu_source = at::randint(-9, 10, {kPicked, kCols}, at::kLong);
  const at::Tensor cpu_rows = at::randperm(kRows, at::kLong).narrow(0, 0, kPicked);
  const at::Tensor cpu_values = at::randint(-9, 10, {kElements}, at::kLong);
  const at::Tensor mask = glue::toMPS(cpu_mask), self = glue::toMPS(cpu_self);
  const at::Tensor source = glue::toMPS(cpu_source), rows = glue::toMPS(cpu_rows);
  const at::Tensor values = glue::toMPS(cpu_values);
  defineIndexingKernels();
  const at::Tensor filled = cpu_values.masked_fill(cpu_mask, kFill);
  const at::Tensor copied = cpu_self.index_copy(0, cpu_rows, cpu_source);
  const at::Tensor picked = cpu_values.index_select(0, cpu_rows);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(kThreads, [&](int) {
    for (int r = 0; r < kRounds; ++r) {
      at::Tensor fill = glue::toMPS(cpu_values);
      at::Tensor copy = glue::toMPS(at::empty({kRows, kCols}, at::kLong));
      at::Tensor pick = glue::toMPS(at::empty({kPicked}, at::kLong));
      @autoreleasepool {
        at::native::masked_fill__mps(fill, mask, kFill);
        glue::Into<at::native::structured_index_copy_out_mps>(copy).impl(self, 0, rows, source, copy);
        indexInto(pick, values, rows);
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_TRUE(glue::toCPU(fill).equal(filled));
      EXPECT_TRUE(glue::toCPU(copy).equal(copied));
      EXPECT_TRUE(glue::toCPU(pick).equal(picked));
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

// repeat_interleave's kernel on stream B reads repeats that stream A's
// kernel is still writing, and stream C's kernel copies its result, with no
// event: each runs after the use before it (the fixture's hazard detector
// is the judge), and C copies the indices of A's repeats. With none of the
// kernel's three uses recorded, every round went wrong (5 of 5 runs); with
// the repeats' alone unrecorded, 9 or 10 of 10 rounds, and with the result's
// alone, 1 to 3, each with the overlap reported in every round.
TEST_F(GlueTest, RepeatInterleaveKernelIsOrderedWithOtherStreamsUsesOfItsBuffers) {
  defineIndexingKernels();
  const at::Tensor cpu_repeats = at::tensor(c10::ArrayRef<int64_t>{2, 0, 3, 1});
  const at::Tensor expected = at::repeat_interleave(cpu_repeats);
  const int64_t total = expected.numel();
  for (int r = 0; r < 10; ++r) {
    at::Tensor repeats = glue::toMPS(at::zeros_like(cpu_repeats));
    const at::Tensor cumulative = glue::toMPS(cpu_repeats.cumsum(0));
    at::Tensor result = glue::toMPS(at::full({total}, -1, at::kLong));
    at::Tensor copy = glue::toMPS(at::full({total}, -1, at::kLong));
    {
      c10::StreamGuard a(at::mps::getMPSStream(2)->unwrap());
      sim::BufferPtr buffer = sim::metal::bufferOf(glue::bufferOf(repeats));
      glue::encodeKernel({glue::bufferOf(repeats)}, [buffer, cpu_repeats] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::copy_n(cpu_repeats.const_data_ptr<int64_t>(), kRepeated, glue::words(*buffer));
      });
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
    }
    {
      c10::StreamGuard b(at::mps::getMPSStream(3)->unwrap());
      @autoreleasepool {
        at::native::computeRepeatIndices<int64_t>(repeats.data_ptr<int64_t>(),
                                                  cumulative.const_data_ptr<int64_t>(),
                                                  result.data_ptr<int64_t>(),
                                                  kRepeated,
                                                  total);
      }
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
    }
    c10::StreamGuard c(at::mps::getMPSStream(4)->unwrap());
    glue::encodeCopy(glue::bufferOf(result), glue::bufferOf(copy));
    at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    EXPECT_TRUE(glue::toCPU(copy).equal(expected)) << "round " << r << ": " << glue::toCPU(copy);
  }
}

} // namespace
