#pragma once

// Harness stand-in for the branch-hint and inlining macros of
// <c10/macros/Macros.h>.

#define C10_LIKELY(expr) (__builtin_expect(static_cast<bool>(expr), 1))
#define C10_UNLIKELY(expr) (__builtin_expect(static_cast<bool>(expr), 0))
#define C10_NOINLINE __attribute__((noinline))
