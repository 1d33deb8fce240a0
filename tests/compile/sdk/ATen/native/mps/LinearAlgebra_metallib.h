// Stand-in for the header PyTorch's build generates from LinearAlgebra.metal
// when PYTORCH_JIT_COMPILE_SHADERS is set (cmake/Metal.cmake,
// metal_to_metallib_h): it defines the translation unit's shader library `lib`
// from the embedded Metal source. The shader text itself is irrelevant to a
// syntax check.
#pragma once
#include <ATen/native/mps/OperationUtils.h>

static ::at::native::mps::MetalShaderLibrary lib("");
