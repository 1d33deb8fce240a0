#include <ATen/mps/MPSEncoderGate.h>

namespace at::mps {

uint8_t EncoderLifecycleGate::resolve() {
  uint8_t state = state_.load(std::memory_order_relaxed);
  if (C10_LIKELY(state != kUnknown)) {
    return state;
  }
  // Throws on a malformed value and leaves the state unknown, so every later
  // use reports the error again.
  state = readEnvSwitch(*switch_).value_or(false) ? kOn : kOff;
  state_.store(state, std::memory_order_relaxed);
  return state;
}

EncoderLifecycleGate& computeEncoderGate() {
  // Leaked on purpose, like the stream pool (Note [MPS stream pool]): streams
  // may end encoders during static destruction.
  static EncoderLifecycleGate* gate =
      new EncoderLifecycleGate(kSerializeComputeEncodersSwitch);
  return *gate;
}

} // namespace at::mps
