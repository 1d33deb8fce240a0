#pragma once

#include <ATen/mps/MPSSerialDispatch.h>

namespace at::mps {

// Note [MPS Apple framework workarounds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dML (github.com/dropbox/dML) found MPS kernels that fail when encoded from
// several threads at once even with per-thread kernel objects, queues and
// command buffers: the shared state is inside Apple's framework, per kernel
// class. Each such family gets one process-wide lock, held only around its
// encoding (SerializedEncode); other ops and MPSGraph paths take none.
// Serialising is not enough for no-graph nn.Linear (dML saw it fail at 3+
// threads even serialised), so ops with an MPSGraph implementation (Linear,
// LayerNorm) take the graph path while more than one stream is active
// (Note [MPS active streams]), or always with MPS_FORCE_GRAPH_PATH=1.
//
// Lock order: family locks are taken inside the serial section, after
// commandBuffer()/commandEncoder(), in increasing RacyKernelFamily order
// (checked at run time). Under one only the stream's own locks are taken.
enum class RacyKernelFamily : uint8_t {
  kMatrixMultiplication, // no-graph nn.Linear, tiled bmm
  kLayerNormKernel, // LayerNorm forward Metal kernel
  kMatrixDecompositionLU, // lu_factor, solve, inv
  kMatrixSolveLU, // solve, inv
  kMatrixSolveTriangular, // solve_triangular, triangular_solve
};
constexpr int kRacyKernelFamilies = 5;

class TORCH_API SerializedEncode {
 public:
  explicit SerializedEncode(RacyKernelFamily family);
  ~SerializedEncode();
  C10_DISABLE_COPY_AND_ASSIGN(SerializedEncode);

 private:
  const int index_;
};

// True if `force` or more than one stream is active. Notes `current` in
// `activity` first, so the caller's stream always counts.
inline bool preferGraphPath(
    bool force,
    StreamActivity& activity,
    StreamIndex current,
    StreamActivity::Clock::time_point now = StreamActivity::Clock::now()) {
  activity.noteEncoding(current, now);
  return force || activity.activeStreams(now) > 1;
}

// With MPS_FORCE_GRAPH_PATH (read once) and streamActivity().
TORCH_API bool preferGraphPathNow(StreamIndex current);

} // namespace at::mps
