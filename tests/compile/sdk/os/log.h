// Declaration-only stand-in for <os/log.h>, written from Apple's public
// documentation for a syntax check on Linux; not Apple's header.
#pragma once
#include <os/object.h>
#include <stdint.h>

STANDIN_OS_OBJECT_DECL(os_log, object);

#ifdef __cplusplus
extern "C" {
#endif
os_log_t os_log_create(const char* subsystem, const char* category);
#ifdef __cplusplus
}
#endif
