// The MPS kernel of aten::record_stream, registered here so that
// native_functions.yaml stays as it is.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/mps/MPSAllocatorInterface.h>
#include <torch/library.h>

namespace at::native {
namespace {

// Records that work queued on `stream` uses `self`'s memory: the MPS
// allocator will not hand that memory out again until the work has completed
// (see Note [MPS allocator cross-stream reuse]). As on CUDA, call it when a
// tensor allocated on one stream is used on another, before it is freed.
void record_stream_mps(Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::MPS,
              "record_stream: expected an MPS stream for an MPS tensor, got ",
              stream);
  at::mps::getIMPSAllocator()->recordStream(self.storage().data_ptr(), stream);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, MPS, m) {
  m.impl("record_stream", TORCH_FN(record_stream_mps));
}

} // namespace at::native
