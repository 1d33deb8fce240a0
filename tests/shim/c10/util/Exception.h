#pragma once

// Harness stand-in for the slice of <c10/util/Exception.h> that the portable
// MPS pool files use. Messages are built the way c10::str builds them, so
// tests can match on the text a PyTorch user would see.

#include <c10/macros/Export.h> // both included as v2.9.1's header does
#include <c10/macros/Macros.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace c10 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream ss;
  (ss << ... << args);
  return ss.str();
}
} // namespace detail

} // namespace c10

#define TORCH_CHECK(cond, ...)                                              \
  do {                                                                      \
    if (!(cond)) {                                                          \
      throw ::c10::Error(::c10::detail::concat("", ##__VA_ARGS__));         \
    }                                                                       \
  } while (false)

#define TORCH_INTERNAL_ASSERT(cond, ...)                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      throw ::c10::Error(::c10::detail::concat(                             \
          "INTERNAL ASSERT FAILED: " #cond " ", ##__VA_ARGS__));            \
    }                                                                       \
  } while (false)
