// Declarations of MPS kernels that torchgen writes into the native-function
// headers of a build with MPS (the macOS wheel's ATen/ops/*_native.h have
// them) and that the Linux wheel's headers lack; the op files the glue
// builds define them.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/bitwise_and_meta.h>
#include <ATen/ops/bitwise_or_meta.h>
#include <ATen/ops/bitwise_xor_meta.h>
#include <ATen/ops/digamma_meta.h>
#include <ATen/ops/index_copy_meta.h>
#include <ATen/ops/lgamma_meta.h>
#include <ATen/ops/polygamma_meta.h>
#include <c10/core/Scalar.h>

#include <optional>
#include <tuple>

namespace at::native {

struct TORCH_API structured_bitwise_and_out_mps
    : public at::meta::structured_bitwise_and_Tensor {
  void impl(
      const at::Tensor& self,
      const at::Tensor& other,
      const at::Tensor& out);
};
struct TORCH_API structured_bitwise_or_out_mps
    : public at::meta::structured_bitwise_or_Tensor {
  void impl(
      const at::Tensor& self,
      const at::Tensor& other,
      const at::Tensor& out);
};
struct TORCH_API structured_bitwise_xor_out_mps
    : public at::meta::structured_bitwise_xor_Tensor {
  void impl(
      const at::Tensor& self,
      const at::Tensor& other,
      const at::Tensor& out);
};
struct TORCH_API structured_lgamma_out_mps
    : public at::meta::structured_lgamma {
  void impl(const at::Tensor& self, const at::Tensor& out);
};
struct TORCH_API structured_digamma_out_mps
    : public at::meta::structured_digamma {
  void impl(const at::Tensor& self, const at::Tensor& out);
};
struct TORCH_API structured_polygamma_out_mps
    : public at::meta::structured_polygamma {
  void impl(int64_t n, const at::Tensor& self, const at::Tensor& out);
};
struct TORCH_API structured_index_copy_out_mps
    : public at::meta::structured_index_copy {
  void impl(
      const at::Tensor& self,
      int64_t dim,
      const at::Tensor& index,
      const at::Tensor& source,
      const at::Tensor& out);
};
TORCH_API at::Tensor _mps_linear(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias);
TORCH_API std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_mps(
    const at::Tensor& input,
    at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias,
    double eps);
TORCH_API std::tuple<at::Tensor, at::Tensor> _fused_rms_norm_mps(
    const at::Tensor& input,
    at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight,
    std::optional<double> eps);
TORCH_API std::tuple<at::Tensor, at::Tensor>
_scaled_dot_product_attention_math_mps(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask,
    double dropout_p,
    bool is_causal,
    const std::optional<at::Tensor>& dropout_mask,
    std::optional<double> scale);
TORCH_API at::Tensor _weight_int4pack_mm_mps(
    const at::Tensor& A,
    const at::Tensor& B,
    int64_t qGroupSize,
    const at::Tensor& qScaleAndZeros);
TORCH_API at::Tensor _weight_int8pack_mm_mps(
    const at::Tensor& A,
    const at::Tensor& B,
    const at::Tensor& scales);
TORCH_API at::Tensor grid_sampler_3d_mps(
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);
TORCH_API at::Tensor& masked_fill__mps(
    at::Tensor& self,
    const at::Tensor& mask,
    const at::Scalar& value);

} // namespace at::native
