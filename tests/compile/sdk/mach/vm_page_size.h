// Declaration-only stand-in for <mach/vm_page_size.h>, written from Apple's
// public documentation for a syntax check on Linux; not Apple's header.
#pragma once
#include <stdint.h>

typedef uintptr_t vm_size_t;

#ifdef __cplusplus
extern "C" {
#endif
extern vm_size_t vm_page_size;
#ifdef __cplusplus
}
#endif
