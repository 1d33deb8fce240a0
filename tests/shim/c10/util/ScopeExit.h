#pragma once

// Harness stand-in for <c10/util/ScopeExit.h>: runs a callable when the
// returned object goes out of scope.

#include <type_traits>
#include <utility>

namespace c10 {

template <typename Callable>
class scope_exit {
 public:
  explicit scope_exit(Callable f) : f_(std::move(f)) {}
  scope_exit(const scope_exit&) = delete;
  scope_exit& operator=(const scope_exit&) = delete;
  ~scope_exit() {
    f_();
  }

 private:
  Callable f_;
};

template <typename Callable>
[[nodiscard]] scope_exit<std::decay_t<Callable>> make_scope_exit(Callable&& f) {
  return scope_exit<std::decay_t<Callable>>(std::forward<Callable>(f));
}

} // namespace c10
