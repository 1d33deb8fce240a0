#pragma once

#include <c10/macros/Export.h>

#include <optional>

namespace at::mps {

// Note [MPS environment switches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An on/off environment variable accepts exactly "1" or "0"; unset or empty
// means its default. Anything else (" 1", "true", "yes") raises an error that
// names the variable and what each value does, so a typo never silently
// selects the default. Each switch is read once, by its owner, and the error
// surfaces from the first operation that needs it.
struct EnvSwitch {
  const char* name;
  const char* on; // what "1" does
  const char* off; // what "0" does
  const char* unset; // what leaving it unset does
};

// nullopt for nullptr or "", true for "1", false for "0"; throws otherwise.
TORCH_API std::optional<bool> parseEnvSwitch(
    const EnvSwitch& sw,
    const char* value);
TORCH_API std::optional<bool> readEnvSwitch(const EnvSwitch& sw);

} // namespace at::mps
