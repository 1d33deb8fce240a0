// Declaration-only stand-in for <mach-o/dyld.h>, written from Apple's public
// documentation for a syntax check on Linux; not Apple's header.
#pragma once
#include <stdint.h>

struct mach_header;

#ifdef __cplusplus
extern "C" {
#endif
uint32_t _dyld_image_count(void);
const struct mach_header* _dyld_get_image_header(uint32_t image_index);
const char* _dyld_get_image_name(uint32_t image_index);
#ifdef __cplusplus
}
#endif
