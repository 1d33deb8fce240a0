// Stand-ins for the Darwin calls the glue makes outside Metal, declared by
// tests/compile/sdk: the page size, the raw monotonic clock, os_log /
// os_signpost, and dyld's image list. No signpost consumer (Instruments) is
// attached, so signposts are disabled and emit nothing, as on a Mac that is
// not recording. The process has no Mach-O image, so the metallib section
// that OperationUtils.mm's bundled shader library looks for is not found and
// that library raises "Can't find metal library section"; what it would
// call after finding the section aborts.

#import <Foundation/Foundation.h>
#include <dispatch/dispatch.h>
#include <mach-o/dyld.h>
#include <mach-o/getsect.h>
#include <mach/vm_page_size.h>
#include <os/log.h>
#include <os/signpost.h>
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

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

uint32_t _dyld_image_count(void) {
  return 0;
}

namespace {
[[noreturn]] void noImage(const char* call) {
  std::fprintf(stderr, "simulated Darwin: %s needs a Mach-O image; this process has none\n", call);
  std::abort();
}
} // namespace

const struct mach_header* _dyld_get_image_header(uint32_t image_index) {
  noImage("_dyld_get_image_header");
}

const char* _dyld_get_image_name(uint32_t image_index) {
  noImage("_dyld_get_image_name");
}

uint8_t* getsectiondata(const struct mach_header_64* mhp,
                        const char* segname,
                        const char* sectname,
                        unsigned long* size) {
  noImage("getsectiondata");
}

dispatch_queue_main_t dispatch_get_main_queue(void) {
  noImage("dispatch_get_main_queue (for a metallib section)");
}

dispatch_data_t dispatch_data_create(const void* buffer,
                                     size_t size,
                                     dispatch_queue_t queue,
                                     dispatch_block_t destructor) {
  noImage("dispatch_data_create (for a metallib section)");
}
