#include <ATen/mps/MPSEncoderGate.h>

namespace at::mps {

uint8_t EncoderLifecycleGate::resolve() {
  // Throws on a malformed value and leaves the state unknown.
  const uint8_t state = readEnvSwitch(*switch_).value_or(false) ? kOn : kOff;
  state_.store(state, std::memory_order_relaxed);
  return state;
}

EncoderLifecycleGate& computeEncoderGate() {
  // Leaked: streams may end encoders during static destruction.
  static auto* gate = new EncoderLifecycleGate(kSerializeComputeEncodersSwitch);
  return *gate;
}

} // namespace at::mps
