// Indexing.mm's Metal-kernel ops on threads that share a model's tensors:
// masked_fill_ through one mask, index_copy of one source's rows into one
// tensor's, and advanced indexing (aten::index's kernel) with one index
// tensor, which the kernel reaches through an argument buffer. The kernels'
// bodies are the test's, in the bundled shader library.

#include "GlueTest.h"
#include "standins/MPSNativeFunctions.h"

#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randperm.h>
#include <c10/core/Scalar.h>

#include <algorithm>
#include <cstdint>

// Static in Indexing.mm; the build's copy of it (extract_function.py) has
// external linkage.
namespace at::native::mps {
void index_kernel_mps(TensorIteratorBase& iter, IntArrayRef index_size, IntArrayRef index_stride);
} // namespace at::native::mps

namespace {

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
    "kernel void index_select_64bit(device long* out, constant long* input) {}\n";

template <typename T>
T* elements(const sim::BufferPtr& buffer) {
  return reinterpret_cast<T*>(buffer->contents());
}

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
}

// index_copy's structured kernel, holding its output as the dispatcher's
// out= wrapper does; impl() writes `out`.
struct IndexCopyInto final : at::native::structured_index_copy_out_mps {
  explicit IndexCopyInto(const at::Tensor& out) : out(out) {}
  const at::Tensor& maybe_get_output(int64_t) override {
    return out;
  }
  const at::Tensor& out;
};

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
        IndexCopyInto(copy).impl(self, 0, rows, source, copy);
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

} // namespace
