// Stand-ins for gatherViewTensor and scatterViewTensor of
// aten/src/ATen/native/mps/operations/View.mm, which Placeholder and Copy.mm
// call for strided views. The glue builds no op kernels (their shaders
// cannot be compiled here) and its tests use contiguous tensors, so reaching
// either is an error that names it.

#include <ATen/native/mps/OperationUtils.h>

namespace at::native::mps {

Tensor gatherViewTensor(const at::Tensor& src, at::Tensor& dst) {
  TORCH_CHECK(false, "gatherViewTensor: View.mm's gather kernels are not built in the glue tests");
}

Tensor& scatterViewTensor(const at::Tensor& src, at::Tensor& output) {
  TORCH_CHECK(false, "scatterViewTensor: View.mm's scatter kernels are not built in the glue tests");
}

} // namespace at::native::mps
