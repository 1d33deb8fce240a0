#include <ATen/mps/MPSCommandBufferLifecycle.h>

#include <cstring>

namespace at::mps {

bool resolveCommitAndContinue(
    StreamIndex index,
    const char* env_value,
    bool profiler_needs_plain_commits) {
  bool enabled = index == kDefaultStreamIndex;
  if (env_value != nullptr && *env_value != '\0') {
    TORCH_CHECK(
        std::strcmp(env_value, "0") == 0 || std::strcmp(env_value, "1") == 0,
        kCommitAndContinueEnvVar,
        "='",
        env_value,
        "' is not valid. Accepted values: 1 (commitAndContinue on every "
        "stream), 0 (off on every stream), or unset (on for the default "
        "stream only).");
    enabled = env_value[0] == '1';
  }
  return enabled && !profiler_needs_plain_commits;
}

} // namespace at::mps
