#include <ATen/mps/MPSSerialDispatch.h>

namespace at::mps {

// Not inline in the header, so that every library sees one chain.
static thread_local const SerialSection* tls_innermost_section = nullptr;

SerialSection::SerialSection(
    const void* queue,
    const SerialSection* outer) noexcept
    : queue_(queue), outer_(outer), saved_(tls_innermost_section) {
  tls_innermost_section = this;
}

SerialSection::~SerialSection() {
  tls_innermost_section = saved_;
}

const SerialSection* SerialSection::innermost() noexcept {
  return tls_innermost_section;
}

bool SerialSection::isActive(const void* queue) noexcept {
  for (const SerialSection* s = tls_innermost_section; s; s = s->outer_) {
    if (s->queue_ == queue) {
      return true;
    }
  }
  return false;
}

StreamActivity& streamActivity() {
  // Atomics only: usable throughout static initialisation and destruction.
  static StreamActivity activity;
  return activity;
}

EncoderLifecycleGate& computeEncoderGate() {
  static constexpr EnvSwitch kSerializeComputeEncodersSwitch{
      "MPS_SERIALIZE_COMPUTE_ENCODERS",
      "create and end compute encoders one at a time across all streams",
      "no gate",
      "no gate"};
  // Leaked: streams may end encoders during static destruction.
  static auto* gate = new EncoderLifecycleGate(
      readEnvSwitch(kSerializeComputeEncodersSwitch).value_or(false));
  return *gate;
}

} // namespace at::mps
