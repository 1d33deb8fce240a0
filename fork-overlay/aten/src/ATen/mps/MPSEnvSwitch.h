#pragma once

#include <c10/macros/Export.h>

#include <optional>

namespace at::mps {

// Note [MPS environment switches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An on/off variable accepts exactly "1" or "0"; unset or empty means the
// default. Anything else (" 1", "true") raises, naming the variable and each
// value's effect, so a typo never silently selects the default. Each switch
// is read once, by its owner; the error surfaces from the first op needing it.
struct EnvSwitch {
  const char* name;
  const char* on; // what "1" does
  const char* off; // what "0" does
  const char* unset; // what leaving it unset does
};

TORCH_API std::optional<bool> parseEnvSwitch(
    const EnvSwitch& sw,
    const char* value);
TORCH_API std::optional<bool> readEnvSwitch(const EnvSwitch& sw);

} // namespace at::mps
