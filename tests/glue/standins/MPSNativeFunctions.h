// Declarations of MPS kernels that torchgen writes into the native-function
// headers of a build with MPS (the macOS wheel's ATen/ops/*_native.h have
// them) and that the Linux wheel's headers lack: the op files the glue
// builds from extracted definitions define them.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/index_copy_meta.h>
#include <c10/core/Scalar.h>

namespace at::native {

struct TORCH_API structured_index_copy_out_mps
    : public at::meta::structured_index_copy {
  void impl(
      const at::Tensor& self,
      int64_t dim,
      const at::Tensor& index,
      const at::Tensor& source,
      const at::Tensor& out);
};
TORCH_API at::Tensor& masked_fill__mps(
    at::Tensor& self,
    const at::Tensor& mask,
    const at::Scalar& value);

} // namespace at::native
