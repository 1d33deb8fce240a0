#include <ATen/mps/MPSFrameworkWorkarounds.h>

namespace at::mps {

static std::array<Mutex, kRacyKernelFamilies>& familyLocks() {
  // Leaked: ops may encode during static destruction.
  static auto* locks = new std::array<Mutex, kRacyKernelFamilies>();
  return *locks;
}
// Bit i set: the calling thread holds family i's lock.
static thread_local uint32_t tls_held_families = 0;

// A lock chosen at run time defeats the analysis; the order is checked here.
SerializedEncode::SerializedEncode(RacyKernelFamily family)
    MPS_NO_THREAD_SAFETY_ANALYSIS : index_(static_cast<int>(family)) {
  TORCH_INTERNAL_ASSERT(
      (tls_held_families >> index_) == 0,
      "MPS kernel-family lock ",
      index_,
      " (a RacyKernelFamily index) taken while holding the same or a later "
      "family's lock; see Note [MPS Apple framework workarounds] for the order");
  familyLocks()[index_].lock();
  tls_held_families |= uint32_t{1} << index_;
}

SerializedEncode::~SerializedEncode() MPS_NO_THREAD_SAFETY_ANALYSIS {
  tls_held_families &= ~(uint32_t{1} << index_);
  familyLocks()[index_].unlock();
}

bool preferGraphPathNow(StreamIndex current) {
  static constexpr EnvSwitch kForceGraphPathSwitch{
      "MPS_FORCE_GRAPH_PATH",
      "always use the MPSGraph path of ops whose Metal-kernel path races",
      "use it while more than one stream is active",
      "use it while more than one stream is active"};
  // A malformed value throws here, and again on the next call.
  static const bool force =
      readEnvSwitch(kForceGraphPathSwitch).value_or(false);
  return preferGraphPath(force, streamActivity(), current);
}

} // namespace at::mps
