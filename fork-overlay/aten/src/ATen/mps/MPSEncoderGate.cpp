#include <ATen/mps/MPSEncoderGate.h>

namespace at::mps {

EncoderLifecycleGate& computeEncoderGate() {
  // Leaked: streams may end encoders during static destruction. A malformed
  // value throws here, and again on the next call.
  static auto* gate = new EncoderLifecycleGate(
      readEnvSwitch(kSerializeComputeEncodersSwitch).value_or(false));
  return *gate;
}

} // namespace at::mps
