#pragma once

#include <ATen/mps/MPSEnvSwitch.h>
#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/macros/Export.h>

#include <utility>

namespace at::mps {

inline constexpr EnvSwitch kSerializeComputeEncodersSwitch{
    "MPS_SERIALIZE_COMPUTE_ENCODERS",
    "create and end compute encoders one at a time across all streams",
    "no gate",
    "no gate"};

// Note [MPS compute-encoder lifecycle gate]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dML (github.com/dropbox/dML) reports AGX driver crashes when one thread
// ends a compute encoder while another, on another queue, creates or uses
// one: a driver race our locking cannot prevent. With
// MPS_SERIALIZE_COMPUTE_ENCODERS=1, compute-encoder creation and endEncoding
// through run() (GatedEncoderOps, MPSGraph encodes) hold one process-wide
// mutex. Encoding into an open encoder is not gated, so streams still encode
// in parallel and the gate narrows the race rather than excluding it. Off
// (default), run() costs one branch. The variable is read on first use; a
// malformed value raises from every use (Note [MPS environment switches]).
//
// The mutex is a leaf lock: fn() must not enter a serial section, a
// command-buffer lifecycle lock or the gate, so callers evaluate
// commandBuffer()/commandEncoder() before run().
class TORCH_API EncoderLifecycleGate {
 public:
  explicit EncoderLifecycleGate(bool enabled) : enabled_(enabled) {}

  bool enabled() const {
    return enabled_;
  }

  template <typename Fn>
  decltype(auto) run(Fn&& fn) MPS_EXCLUDES(mu_) {
    if (!enabled_) {
      return std::forward<Fn>(fn)();
    }
    MutexLock lock(mu_);
    return std::forward<Fn>(fn)();
  }

 private:
  const bool enabled_;
  Mutex mu_;
};

TORCH_API EncoderLifecycleGate& computeEncoderGate();

// Lifecycle ops (Note [MPS command buffer lifecycle]), gated.
template <typename Ops>
class GatedEncoderOps : public Ops {
 public:
  explicit GatedEncoderOps(
      Ops ops,
      EncoderLifecycleGate& gate = computeEncoderGate())
      : Ops(std::move(ops)), gate_(&gate) {}

  typename Ops::Encoder makeComputeEncoder(const typename Ops::Buffer& buffer) {
    return gate_->run([&]() { return Ops::makeComputeEncoder(buffer); });
  }
  void endEncoding(const typename Ops::Encoder& encoder) {
    gate_->run([&]() { Ops::endEncoding(encoder); });
  }

 private:
  EncoderLifecycleGate* gate_;
};

} // namespace at::mps
