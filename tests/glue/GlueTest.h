#pragma once

// What the glue tests share: a fixture that checks the hazard detector after
// every test, and the few things an ATen op does with a stream, done the way
// OperationUtils does them (dispatch_sync onto the stream's queue, the
// compute encoder of the stream, getMTLBufferStorage's dependency hook).

#include <ATen/core/Tensor.h>
#include <ATen/mps/MPSStream.h>
#include <c10/core/Allocator.h>

#include "../support/stream_pool_peer.h"
#include "SimMetalRuntime.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace glue {

// Note [glue test fixture]
// Every test ends with all streams synchronized and the simulated GPU idle,
// and then requires that the hazard detector saw no race: no buffer accessed
// by two queues at once with a write, and no buffer handed out (checked by
// allocated()) to a queue while another queue's work on it was in flight.
class GlueTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
};

// The buffer behind an MPS allocation.
inline id<MTLBuffer> bufferOf(const c10::DataPtr& data) {
  return (__bridge id<MTLBuffer>)data.get();
}
inline id<MTLBuffer> bufferOf(const at::Tensor& tensor) {
  return bufferOf(tensor.storage().data_ptr());
}

// Worker slots leased now in the process-wide pool.
inline int leasedSlots() {
  return at::mps::StreamSlotPoolTestPeer::leasedSlots(
      at::mps::getMPSStreamPool().slots());
}

// An allocation from the MPS allocator for the calling thread's current
// stream, checked by the hazard detector as it is handed out.
c10::DataPtr allocated(size_t bytes);

// A contiguous MPS tensor (int64 unless `dtype` says otherwise) over the MPS
// allocator, made without an ATen op: the Linux wheel registers no MPS
// kernel but the ones this build links in.
at::Tensor mpsTensor(int64_t elements, at::ScalarType dtype = at::kLong);

// An MPS tensor with `cpu`'s shape, dtype and values (undefined for an
// undefined `cpu`), written from the host after the calling thread's stream
// finished its work; and a CPU copy of an MPS tensor whose work completed.
at::Tensor toMPS(const at::Tensor& cpu);
at::Tensor toCPU(const at::Tensor& mps);

// Requires `got` to have `expected`'s dtype and shape and its values within
// 1e-5 in float32, and within two units in the last place in float16, where
// the CPU rounds its float32 result and the simulator its double one.
void expectClose(
    const at::Tensor& got,
    const at::Tensor& expected,
    const char* what);

// The contents of `buffer` as int64 words: from the host, read only after
// the work that writes them completed; in a kernel body, the GPU's view.
int64_t* words(sim::Buffer& buffer);
int64_t* words(id<MTLBuffer> buffer);
// The same, as elements of type T, for kernel bodies.
template <typename T>
T* elements(const sim::BufferPtr& buffer) {
  return reinterpret_cast<T*>(buffer->contents());
}
// A kernel body's view of `buffer`'s float elements as a CPU tensor of
// `sizes`.
at::Tensor floats(const sim::BufferPtr& buffer, at::IntArrayRef sizes);

// A structured kernel (an op file's TORCH_IMPL_FUNC) holding its output as
// the dispatcher's out= wrapper does; impl() writes the `out` it is given.
template <typename Kernel>
struct Into final : Kernel {
  explicit Into(const at::Tensor& out) : out(out) {}
  const at::Tensor& maybe_get_output(int64_t) override {
    return out;
  }
  const at::Tensor& out;
};

// An op on the calling thread's current stream, in its own autorelease pool
// as ops have: binds `buffers` in the stream's compute encoder and
// dispatches one kernel whose body runs on the simulated GPU. kTracked
// records each buffer as written, as getMTLBufferStorage does; kUntracked is
// work the dependency tracker does not see (a user's own Metal code on the
// stream's command buffer), which only events or synchronization order.
enum class Tracking { kTracked, kUntracked };
void encodeKernel(
    const std::vector<id<MTLBuffer>>& buffers,
    std::function<void()> body,
    Tracking tracking = Tracking::kTracked);

// A kernel on stream `s` that uses `buffer` for 500 µs, then committed: work
// that a block freed meanwhile must wait for before it is handed out again.
void encodeSlowUseOn(const c10::Stream& s, id<MTLBuffer> buffer);

// Kernels: every word of `buffer` += 1; every word of `dst` = `src`'s.
void encodeIncrement(id<MTLBuffer> buffer);
void encodeCopy(id<MTLBuffer> src, id<MTLBuffer> dst);

// The waits the dependency tracker has made so far, as the simulated Metal
// counts them (sim::metal::eventWaits(); the glue tests that use this make no
// Event waits): its GPU waits and CPU waits for a stream's work to complete.
// A wait for a stream's commit is followed by a GPU wait unless that work
// completed meanwhile.
int64_t trackerWaits();

// Runs fn(0) .. fn(n - 1) on n threads at once and joins them. An error a
// thread raises is the test's failure, naming the thread.
void onThreads(int n, const std::function<void(int)>& fn);

// Another thread on `stream`, as threads beyond the pool's worker streams
// share one, from construction until destruction: over and over, it encodes
// an empty kernel there (leaving its encoder open) and then, in a serial
// section of its own, runs then(i), i = 0, 1, 2, ...
class OtherThreadOnStream {
 public:
  OtherThreadOnStream(
      at::mps::MPSStream* stream,
      std::function<void(int)> then);
  ~OtherThreadOnStream();
  OtherThreadOnStream(const OtherThreadOnStream&) = delete;
  OtherThreadOnStream& operator=(const OtherThreadOnStream&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Polls `done` until it holds or `limit` passes; true if it held.
bool eventually(
    const std::function<bool()>& done,
    std::chrono::milliseconds limit = std::chrono::seconds(20));

} // namespace glue
