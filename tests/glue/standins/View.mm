// Stand-in for gatherViewTensor of aten/src/ATen/native/mps/operations/View.mm,
// which Placeholder calls to gather a strided view when the strided MPSGraph
// API is not used. The glue builds no op kernels (their shaders cannot be
// compiled here) and its tests bind contiguous tensors, so reaching it is an
// error that names it.

#include <ATen/native/mps/OperationUtils.h>

namespace at::native::mps {

Tensor gatherViewTensor(const at::Tensor& src, at::Tensor& dst) {
  TORCH_CHECK(false, "gatherViewTensor: View.mm's gather kernels are not built in the glue tests");
}

} // namespace at::native::mps
