// Copy.mm's copies of an MPS tensor: into a CPU tensor of another dtype,
// which casts through a cached MPSGraph straight into the CPU tensor's memory
// (a no-copy MTLBuffer over it) and, when blocking, waits for the stream; and
// the blits and casts of one source on many streams, and copies of strided
// views, which View.mm's gather and scatter kernels make. The simulated graph
// casts its feed's elements to the result's data type.

#include "GlueTest.h"

#include <ATen/core/Tensor.h>
#include <ATen/native/mps/Copy.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/StreamGuard.h>
#include <mach/vm_page_size.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>

namespace {

using glue::GlueTest;

constexpr int64_t kElements = 1000;

// An int64 MPS tensor holding first, first + 1, ...
at::Tensor mpsCounting(int64_t first) {
  at::Tensor t = glue::mpsTensor(kElements);
  int64_t* w = glue::words(glue::bufferOf(t));
  for (int64_t i = 0; i < kElements; ++i) {
    w[i] = first + i;
  }
  return t;
}

// An int32 CPU tensor over whole pages, so that Copy.mm casts into its
// memory directly instead of through a blit.
at::Tensor pageAlignedCpuInts() {
  const size_t bytes = (kElements * sizeof(int32_t) + vm_page_size - 1) / vm_page_size * vm_page_size;
  void* memory = std::aligned_alloc(vm_page_size, bytes);
  return at::from_blob(
      memory, {kElements}, [](void* p) { std::free(p); }, at::TensorOptions().dtype(at::kInt));
}

// Copy.mm's copy, in an autorelease pool as the tests' other ops are: it
// makes its graph shapes before entering its own pool.
void copy(at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  @autoreleasepool {
    at::native::mps::mps_copy_(dst, src, non_blocking);
  }
}

bool counts(const at::Tensor& cpu, int64_t first) {
  const int32_t* v = cpu.const_data_ptr<int32_t>();
  for (int64_t i = 0; i < kElements; ++i) {
    if (v[i] != first + i) {
      return false;
    }
  }
  return true;
}

// A blocking copy returns with the cast values in the CPU tensor.
TEST_F(GlueTest, BlockingCastCopyToTheCPUReturnsTheCastValues) {
  at::Tensor src = mpsCounting(-500);
  at::Tensor dst = pageAlignedCpuInts();
  copy(dst, src, /*non_blocking=*/false);
  EXPECT_TRUE(counts(dst, -500)) << "dst[0] = " << dst.const_data_ptr<int32_t>()[0];
}

// A cast copy between MPS tensors on stream B of a tensor that stream A's
// kernel is still writing casts what that kernel wrote, with no event: the
// copy records its buffers with the dependency tracker, through
// getMTLBufferStorage() and, for its graph's feed and result (which are not
// Placeholders), noteMPSGraphUse(). Either alone orders this read.
TEST_F(GlueTest, CastCopyBetweenMPSTensorsRunsAfterAnotherStreamsWriteOfItsSource) {
  at::Tensor src = mpsCounting(0);
  at::Tensor dst = glue::mpsTensor(kElements, at::kInt);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  at::mps::MPSStream* a = at::mps::getMPSStream(1);
  at::mps::MPSStream* b = at::mps::getMPSStream(2);
  {
    c10::StreamGuard guard(a->unwrap());
    glue::encodeKernel({glue::bufferOf(src)}, [w = glue::words(glue::bufferOf(src))] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (int64_t i = 0; i < kElements; ++i) {
        w[i] = 3000 + i;
      }
    });
    a->synchronize(at::mps::SyncType::COMMIT);
  }
  {
    c10::StreamGuard guard(b->unwrap());
    copy(dst, src, /*non_blocking=*/true);
    b->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  }
  const int32_t* v = reinterpret_cast<const int32_t*>(sim::metal::bufferOf(glue::bufferOf(dst))->contents());
  EXPECT_EQ(v[0], 3000);
  EXPECT_EQ(v[kElements - 1], 3000 + kElements - 1);
}

// Two streams' blocking copies with one cast graph: the second copy
// completes while the first one's stream cannot finish. The first copy waits
// for its stream after the graph's encode lock is released; holding the
// lock through the wait would keep every other stream's copy of that dtype
// pair waiting on this stream's work (Note [MPS graph and kernel caches]).
TEST_F(GlueTest, BlockingCastCopyWaitsForItsStreamOutsideTheCastGraphsEncodeLock) {
  at::Tensor src_a = mpsCounting(0), src_b = mpsCounting(7000);
  at::Tensor dst_a = pageAlignedCpuInts(), dst_b = pageAlignedCpuInts();
  at::mps::MPSStream* a = at::mps::getMPSStream(1);
  at::mps::MPSStream* b = at::mps::getMPSStream(2);
  sim::Queue& queue_a = sim::metal::queueOf(a->commandQueue());
  queue_a.pause();
  std::atomic<bool> a_done{false}, b_done{false};
  bool a_encoded = false, b_done_while_a_waited = false, a_done_before_resume = false;
  glue::onThreads(3, [&](int t) {
    if (t == 0) {
      c10::StreamGuard guard(a->unwrap());
      copy(dst_a, src_a, /*non_blocking=*/false);
      a_done.store(true);
    } else if (t == 1) {
      a_encoded = glue::eventually([&] { return queue_a.pending() > 0; });
      c10::StreamGuard guard(b->unwrap());
      copy(dst_b, src_b, /*non_blocking=*/false);
      b_done.store(true);
    } else {
      glue::eventually([&] { return queue_a.pending() > 0; });
      b_done_while_a_waited = glue::eventually([&] { return b_done.load(); }, std::chrono::seconds(5));
      a_done_before_resume = a_done.load();
      queue_a.resume();
    }
  });
  EXPECT_TRUE(a_encoded);
  EXPECT_TRUE(b_done_while_a_waited) << "the second copy waited for the first copy's stream";
  EXPECT_FALSE(a_done_before_resume);
  EXPECT_TRUE(counts(dst_a, 0));
  EXPECT_TRUE(counts(dst_b, 7000));
}

// Eight threads copy one source, which no stream writes any more, on their
// own streams as threads sharing a model's tensors do: into an MPS tensor of
// the same dtype (a blit), into one of another dtype (the cast graph) and
// into the CPU (a non-blocking blit). Every copy reads the source only, so
// none waits for another stream. With the sources recorded as written, every
// run raised "neither can go first" on four to six threads, and the tracker
// counted 100 to 220 waits. Nor does a copy write the source tensor: when
// the blit set its conjugate and negative bits (to the values they had),
// ThreadSanitizer reported the race with other threads' reads in 4 of 4 runs.
TEST_F(GlueTest, CopiesOfOneSourceOnManyStreamsNeedNoWaits) {
  const at::Tensor src = mpsCounting(100);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(8, [&](int) {
    for (int r = 0; r < 5; ++r) {
      at::Tensor same = glue::mpsTensor(kElements);
      at::Tensor cast = glue::mpsTensor(kElements, at::kInt);
      at::Tensor cpu = at::empty({kElements}, at::kLong);
      copy(same, src, /*non_blocking=*/true);
      copy(cast, src, /*non_blocking=*/true);
      copy(cpu, src, /*non_blocking=*/true);
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_EQ(glue::words(glue::bufferOf(same))[kElements - 1], 100 + kElements - 1);
      EXPECT_TRUE(counts(glue::toCPU(cast), 100));
      EXPECT_EQ(cpu.const_data_ptr<int64_t>()[kElements - 1], 100 + kElements - 1);
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

constexpr int64_t kRows = 20, kCols = kElements / kRows;

// View.mm's gather (a strided source into a contiguous tensor) and scatter
// (a contiguous source into a strided tensor) of the views below: both
// write, at c * kRows + r of their second buffer, element r * kCols + c of
// their first. The simulator does not keep the sizes and strides the ops
// pass as constants.
void defineTransposingKernels() {
  const auto transpose = [](const std::vector<sim::BufferPtr>& buffers) {
    const int64_t* in = glue::elements<int64_t>(buffers.at(0));
    int64_t* out = glue::elements<int64_t>(buffers.at(1));
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) {
        out[c * kRows + r] = in[r * kCols + c];
      }
    }
  };
  sim::metal::defineKernel("gather_kernel_2", transpose);
  sim::metal::defineKernel("scatter_kernel_2", transpose);
}

bool transposed(const int64_t* t, int64_t first) {
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      if (t[c * kRows + r] != first + r * kCols + c) {
        return false;
      }
    }
  }
  return true;
}

// Eight threads copy strided views of one source, as threads that share a
// model's weight and transpose it do: its transpose into an MPS tensor and
// into the CPU (View.mm's gather), and the source into the transpose of an
// MPS tensor of their own (its scatter). The kernels only read the source,
// so no copy waits for another stream. With the source bound as a write,
// every run raised "neither can go first" on five to seven threads, and the
// tracker counted 70 to 94 waits (27 to 57 with the scatter's alone, 105 to
// 121 with the gather's alone).
TEST_F(GlueTest, StridedCopiesOfOneSourceOnManyStreamsNeedNoWaits) {
  defineTransposingKernels();
  const at::Tensor src = mpsCounting(100).view({kRows, kCols});
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  glue::onThreads(8, [&](int) {
    for (int r = 0; r < 5; ++r) {
      at::Tensor gathered = glue::mpsTensor(kElements).view({kCols, kRows});
      at::Tensor cpu = at::empty({kCols, kRows}, at::kLong);
      at::Tensor scattered = glue::mpsTensor(kElements).view({kCols, kRows});
      at::Tensor scattered_t = scattered.t();
      copy(gathered, src.t(), /*non_blocking=*/true);
      copy(cpu, src.t(), /*non_blocking=*/false);
      copy(scattered_t, src, /*non_blocking=*/true);
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_TRUE(transposed(glue::words(glue::bufferOf(gathered)), 100));
      EXPECT_TRUE(transposed(cpu.const_data_ptr<int64_t>(), 100));
      EXPECT_TRUE(transposed(glue::words(glue::bufferOf(scattered)), 100));
    }
  });
  EXPECT_EQ(glue::trackerWaits(), waits_before);
}

} // namespace
