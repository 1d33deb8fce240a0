#pragma once

// An opt-in, process-wide gate that serialises compute-encoder creation and
// end across all MPS streams.

#include <ATen/mps/MPSEnvSwitch.h>
#include <ATen/mps/MPSThreadAnnotations.h>
#include <c10/macros/Export.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstdint>
#include <utility>

namespace at::mps {

inline constexpr EnvSwitch kSerializeComputeEncodersSwitch{
    "MPS_SERIALIZE_COMPUTE_ENCODERS",
    "create and end compute encoders one at a time across all streams",
    "no gate",
    "no gate"};

// Note [MPS compute-encoder lifecycle gate]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The dML project reports crashes inside Apple's AGX driver when one thread
// tears down a compute encoder (its driver context) while another thread,
// on another command queue, is creating or using one: a driver-side race,
// not a Metal contract violation, so nothing in our own locking prevents it.
// With MPS_SERIALIZE_COMPUTE_ENCODERS=1 every compute-encoder creation and
// endEncoding made through the gate runs under one process-wide mutex, so no
// two such lifecycle transitions overlap anywhere in the process. Encoding
// into an open encoder is not gated: that keeps kernels of different streams
// encoding in parallel, and it means the gate narrows the reported race
// rather than excluding it.
//
// The gate is off by default and costs one relaxed atomic load per call when
// off. The variable is read on first use (strictly, see Note [MPS environment
// switches]); a malformed value raises the error from that first use and from
// every later one. There is no method swizzling: the gate covers exactly the
// calls routed through run(), i.e. the streams' own encoder lifecycle
// (GatedEncoderOps) and any encode call wrapped explicitly.
//
// The gate's mutex is a leaf lock: nothing run() executes may acquire a
// stream's serial section, a command-buffer lifecycle lock, or the gate
// itself. Callers evaluate commandBuffer()/commandEncoder() before entering.
class TORCH_API EncoderLifecycleGate {
 public:
  // Reads `sw` on first use.
  constexpr explicit EncoderLifecycleGate(const EnvSwitch& sw)
      : switch_(&sw), state_(kUnknown) {}
  // A gate in a fixed state, for tools and tests.
  explicit EncoderLifecycleGate(bool enabled)
      : switch_(nullptr), state_(enabled ? kOn : kOff) {}
  EncoderLifecycleGate(const EncoderLifecycleGate&) = delete;
  EncoderLifecycleGate& operator=(const EncoderLifecycleGate&) = delete;

  bool enabled() {
    return resolve() == kOn;
  }

  // Returns fn(), run under the gate's mutex when the gate is on.
  template <typename Fn>
  decltype(auto) run(Fn&& fn) MPS_EXCLUDES(mu_) {
    if (C10_LIKELY(state_.load(std::memory_order_relaxed) == kOff)) {
      return std::forward<Fn>(fn)();
    }
    return runResolved(fn);
  }

 private:
  enum : uint8_t { kUnknown, kOff, kOn };

  // kOff or kOn; reads the switch if that has not happened yet. Concurrent
  // first uses may all read it: they store the same result.
  uint8_t resolve();

  template <typename Fn>
  decltype(auto) runResolved(Fn& fn) MPS_EXCLUDES(mu_) {
    if (resolve() == kOff) {
      return fn();
    }
    MutexLock lock(mu_);
    return fn();
  }

  const EnvSwitch* const switch_;
  std::atomic<uint8_t> state_;
  Mutex mu_;
};

// The process-wide gate, configured by MPS_SERIALIZE_COMPUTE_ENCODERS.
TORCH_API EncoderLifecycleGate& computeEncoderGate();

// Lifecycle ops (see Note [MPS command buffer lifecycle]) whose compute
// encoder creation and endEncoding pass through a gate: a stream uses
// CommandBufferLifecycle<GatedEncoderOps<Ops>> instead of
// CommandBufferLifecycle<Ops>.
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
