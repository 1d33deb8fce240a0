#pragma once

// Harness stand-in for the branch-hint, inlining and copy-disabling macros of
// <c10/macros/Macros.h>.

#define C10_LIKELY(expr) (__builtin_expect(static_cast<bool>(expr), 1))
#define C10_UNLIKELY(expr) (__builtin_expect(static_cast<bool>(expr), 0))
#define C10_NOINLINE __attribute__((noinline))
#define C10_DISABLE_COPY_AND_ASSIGN(classname) \
  classname(const classname&) = delete;        \
  classname& operator=(const classname&) = delete
