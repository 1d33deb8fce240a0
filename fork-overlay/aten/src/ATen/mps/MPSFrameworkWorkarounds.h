#pragma once

// Workarounds for Apple-framework races under concurrent encoding: one named
// lock per affected kernel family, and the choice of the MPSGraph path while
// several streams are active.

#include <ATen/mps/MPSEnvSwitch.h>
#include <ATen/mps/MPSStreamActivity.h>
#include <ATen/mps/MPSStreamPool.h>
#include <c10/macros/Export.h>

#include <cstdint>

namespace at::mps {

// Note [MPS Apple framework workarounds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The dML project found MPS kernels that crash or fail when encoded from
// several threads at once, even when every thread has its own kernel object,
// its own command queue and its own command buffer: the shared state is
// inside Apple's framework, per kernel class, so no per-object lock helps.
// Each such kernel family gets one process-wide lock, held only around the
// encoding of that family (SerializedEncode); unaffected ops and the MPSGraph
// paths take none of them.
//
// Where an op also has an MPSGraph implementation (nn.Linear, LayerNorm),
// serialising is not enough (dML saw the no-graph Linear path fail at 3+
// threads even with its encoding serialised), so the op takes the graph path
// while more than one stream is active (Note [MPS active streams]), and always
// with MPS_FORCE_GRAPH_PATH=1. Single-stream programs keep the faster kernel
// path.
//
// Lock order: family locks are taken inside the stream's serial section,
// after commandBuffer()/commandEncoder(), in increasing RacyKernelFamily order
// when an op needs several (checked: out-of-order acquisition is an error,
// never a latent deadlock). Under a family lock only the encode lock of a
// cached kernel (Note [MPS graph and kernel caches]) and the stream's own
// locks may be taken.
enum class RacyKernelFamily : uint8_t {
  // MPSNDArrayMatrixMultiplication: the nn.Linear no-graph path, tiled bmm.
  kMatrixMultiplication = 0,
  // The LayerNorm forward Metal kernel.
  kLayerNormKernel,
  // MPSMatrixDecompositionLU: lu_factor, solve, inv.
  kMatrixDecompositionLU,
  // MPSMatrixSolveLU: solve, inv.
  kMatrixSolveLU,
  // MPSMatrixSolveTriangular: solve_triangular, triangular_solve.
  kMatrixSolveTriangular,
};
constexpr int kRacyKernelFamilies = 5;

TORCH_API const char* racyKernelFamilyName(RacyKernelFamily family);

// Holds `family`'s process-wide lock for its scope.
class TORCH_API SerializedEncode {
 public:
  explicit SerializedEncode(RacyKernelFamily family);
  ~SerializedEncode();
  SerializedEncode(const SerializedEncode&) = delete;
  SerializedEncode& operator=(const SerializedEncode&) = delete;

 private:
  const RacyKernelFamily family_;
};

inline constexpr EnvSwitch kForceGraphPathSwitch{
    "MPS_FORCE_GRAPH_PATH",
    "always use the MPSGraph path of ops whose Metal-kernel path races",
    "use it while more than one stream is active",
    "use it while more than one stream is active"};

enum class GraphPathMode {
  kAuto, // graph path while more than one stream is active
  kForce, // always the graph path
};

// Parses MPS_FORCE_GRAPH_PATH's value (nullptr: unset); see
// Note [MPS environment switches].
TORCH_API GraphPathMode parseGraphPathMode(const char* value);

inline bool preferGraphPath(GraphPathMode mode, int active_streams) {
  return mode == GraphPathMode::kForce || active_streams > 1;
}

// Whether an op with a racy kernel path should take its graph path now, on
// stream `current`: notes `current` in `activity` first, so the caller's own
// stream always counts.
TORCH_API bool preferGraphPath(
    GraphPathMode mode,
    StreamActivity& activity,
    StreamIndex current,
    StreamActivity::Clock::time_point now = StreamActivity::Clock::now());

// The process-wide decision: MPS_FORCE_GRAPH_PATH (read once) and
// streamActivity().
TORCH_API bool preferGraphPathNow(StreamIndex current);

} // namespace at::mps
