// Declaration-only stand-in for Darwin's additions to <time.h>, written from
// Apple's public documentation (clock_gettime_nsec_np(3)) for a syntax check
// on Linux; not Apple's header. The C library's <time.h> supplies the rest,
// including CLOCK_MONOTONIC_RAW.
#pragma once
#include <stdint.h>
#include_next <time.h>

#ifdef __cplusplus
extern "C" {
#endif
uint64_t clock_gettime_nsec_np(clockid_t clock_id);
#ifdef __cplusplus
}
#endif
