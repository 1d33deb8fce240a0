// aten::record_stream for MPS, registered here to leave native_functions.yaml as it is. As on CUDA, `self` is not
// reused until `stream`'s queued work completes; see Note [MPS allocator cross-stream reuse].

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/mps/MPSAllocatorInterface.h>
#include <torch/library.h>

TORCH_LIBRARY_IMPL(aten, MPS, m) {
  m.impl("record_stream", [](at::Tensor& self, c10::Stream stream) {
    at::mps::getIMPSAllocator()->recordStream(self.storage().data_ptr(), stream);
  });
}
