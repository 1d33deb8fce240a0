// Stand-ins for the Darwin calls the glue makes outside Metal, declared by
// tests/compile/sdk: the page size, the raw monotonic clock, and os_log /
// os_signpost. No signpost consumer (Instruments) is attached, so signposts
// are disabled and emit nothing, as on a Mac that is not recording.

#import <Foundation/Foundation.h>
#include <mach/vm_page_size.h>
#include <os/log.h>
#include <os/signpost.h>
#include <time.h>

#include <atomic>

// Apple silicon's page size.
vm_size_t vm_page_size = 16384;

uint64_t clock_gettime_nsec_np(clockid_t clock_id) {
  struct timespec ts;
  clock_gettime(clock_id, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

@interface SimOSLog : NSObject<OS_os_log>
@end

@implementation SimOSLog
@end

os_log_t os_log_create(const char* subsystem, const char* category) {
  return [[SimOSLog alloc] init];
}

void os_release(void* object) {
  [(id)object release];
}

bool os_signpost_enabled(os_log_t log) {
  return false;
}

os_signpost_id_t os_signpost_id_generate(os_log_t log) {
  static std::atomic<os_signpost_id_t> next{1};
  return next.fetch_add(1);
}

os_signpost_id_t os_signpost_id_make_with_pointer(os_log_t log, const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr);
}

void standin_os_signpost_emit(os_log_t, os_signpost_type_t, os_signpost_id_t, const char*, const char*, ...) {}
