// Declaration-only stand-in for <os/signpost.h>, written from Apple's public
// documentation for a syntax check on Linux; not Apple's header.
//
// Apple documents the emit/begin/end calls as macros whose name argument must
// be a string literal and whose message is a format string; the macros below
// keep both constraints (the `name ""` concatenation rejects a non-literal) so
// that a misuse still fails to compile.
#pragma once
#include <os/log.h>
#include <stdbool.h>
#include <stdint.h>

typedef uint64_t os_signpost_id_t;

enum os_signpost_type_t : uint8_t {
  OS_SIGNPOST_EVENT = 0x00,
  OS_SIGNPOST_INTERVAL_BEGIN = 0x01,
  OS_SIGNPOST_INTERVAL_END = 0x02,
};
typedef enum os_signpost_type_t os_signpost_type_t;

#ifdef __cplusplus
extern "C" {
#endif
os_signpost_id_t os_signpost_id_generate(os_log_t log);
os_signpost_id_t os_signpost_id_make_with_pointer(
    os_log_t log,
    const void* ptr);
bool os_signpost_enabled(os_log_t log);
void standin_os_signpost_emit(
    os_log_t log,
    os_signpost_type_t type,
    os_signpost_id_t spid,
    const char* name,
    const char* format,
    ...) __attribute__((format(printf, 5, 6)));
#ifdef __cplusplus
}
#endif

#define os_signpost_event_emit(log, event_id, name, ...) \
  standin_os_signpost_emit(                              \
      log, OS_SIGNPOST_EVENT, event_id, name "", "" __VA_ARGS__)
#define os_signpost_interval_begin(log, interval_id, name, ...) \
  standin_os_signpost_emit(                                     \
      log, OS_SIGNPOST_INTERVAL_BEGIN, interval_id, name "", "" __VA_ARGS__)
#define os_signpost_interval_end(log, interval_id, name, ...) \
  standin_os_signpost_emit(                                   \
      log, OS_SIGNPOST_INTERVAL_END, interval_id, name "", "" __VA_ARGS__)
