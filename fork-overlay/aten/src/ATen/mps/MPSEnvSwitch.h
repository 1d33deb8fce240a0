#pragma once

// Strict parsing of the on/off environment variables of the MPS backend.

#include <c10/macros/Export.h>

#include <optional>

namespace at::mps {

// Note [MPS environment switches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A switch is an environment variable that accepts exactly "1" (on) or "0"
// (off); unset or empty means the variable's default. Anything else (" 1",
// "true", "01", "yes") raises an error that names the variable and says what
// each accepted value does, so a typo never silently selects the default.
// Each switch is read once, by the component that owns it, and the error
// surfaces from the first operation that needs it.

struct EnvSwitch {
  const char* name; // e.g. "MPS_FORCE_GRAPH_PATH"
  const char* on; // what "1" does
  const char* off; // what "0" does
  const char* unset; // what leaving the variable unset does
};

// Parses `value` (nullptr: unset). Returns nullopt for unset or empty,
// true for "1", false for "0"; throws for anything else.
TORCH_API std::optional<bool> parseEnvSwitch(
    const EnvSwitch& sw,
    const char* value);

// parseEnvSwitch() of the current value of sw.name.
TORCH_API std::optional<bool> readEnvSwitch(const EnvSwitch& sw);

} // namespace at::mps
