// Declaration-only stand-in for <mach-o/getsect.h>, written from Apple's public
// documentation for a syntax check on Linux; not Apple's header. Only the
// 64-bit form is declared: PyTorch's MPS backend builds for arm64 only.
#pragma once
#include <stdint.h>

struct mach_header_64;

#ifdef __cplusplus
extern "C" {
#endif
uint8_t* getsectiondata(
    const struct mach_header_64* mhp,
    const char* segname,
    const char* sectname,
    unsigned long* size);
#ifdef __cplusplus
}
#endif
