#include <ATen/mps/MPSEnvSwitch.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

namespace at::mps {

std::optional<bool> parseEnvSwitch(const EnvSwitch& sw, const char* value) {
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  const bool on = std::strcmp(value, "1") == 0;
  TORCH_CHECK(
      on || std::strcmp(value, "0") == 0,
      sw.name,
      "='",
      value,
      "' is not valid. Accepted values: 1 (",
      sw.on,
      "), 0 (",
      sw.off,
      "), or unset (",
      sw.unset,
      ").");
  return on;
}

std::optional<bool> readEnvSwitch(const EnvSwitch& sw) {
  return parseEnvSwitch(sw, std::getenv(sw.name));
}

} // namespace at::mps
