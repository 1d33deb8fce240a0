// Stand-ins for the Darwin calls the glue makes outside Metal, declared by
// tests/compile/sdk: the page size, the raw monotonic clock, os_log /
// os_signpost, and dyld's image list. No signpost consumer (Instruments) is
// attached, so signposts are disabled and emit nothing, as on a Mac that is
// not recording. The process has one Mach-O image, libtorch_cpu's, whose
// metallib section (what OperationUtils.mm's bundled shader library loads)
// holds the text that sim::metal::setBundledShaderSource() gave, which the
// simulated device compiles as a source; without one, the section is not
// found and that library raises "Can't find metal library section".

#import <Foundation/Foundation.h>
#include <dispatch/dispatch.h>
#include <mach-o/dyld.h>
#include <mach-o/getsect.h>
#include <mach/vm_page_size.h>
#include <os/log.h>
#include <os/signpost.h>
#include <time.h>

#include "SimMetalRuntime.h"
#include "SimObjC.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

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

namespace {
std::mutex bundled_mu;
std::string* bundled = nullptr; // leaked: the section outlives its readers
// Where libtorch_cpu's image header would be; nothing reads it.
alignas(8) const unsigned char libtorch_header[32] = {};
} // namespace

void sim::metal::setBundledShaderSource(const std::string& source) {
  std::lock_guard<std::mutex> lock(bundled_mu);
  if (bundled == nullptr) {
    bundled = new std::string();
  }
  *bundled = source;
}

uint32_t _dyld_image_count(void) {
  return 1;
}

const struct mach_header* _dyld_get_image_header(uint32_t image_index) {
  return image_index == 0 ? reinterpret_cast<const struct mach_header*>(libtorch_header) : nullptr;
}

const char* _dyld_get_image_name(uint32_t image_index) {
  return image_index == 0 ? "/simulated/libtorch_cpu.dylib" : nullptr;
}

uint8_t* getsectiondata(const struct mach_header_64* mhp,
                        const char* segname,
                        const char* sectname,
                        unsigned long* size) {
  std::lock_guard<std::mutex> lock(bundled_mu);
  if (reinterpret_cast<const unsigned char*>(mhp) != libtorch_header || std::strcmp(segname, "__TEXT") != 0 ||
      std::strcmp(sectname, "metal_basic") != 0 || bundled == nullptr) {
    return nullptr;
  }
  *size = bundled->size();
  return reinterpret_cast<uint8_t*>(bundled->data());
}

// The bytes of a dispatch data object, which the simulated device reads.
@interface SimDispatchData : NSObject<OS_dispatch_data>
@end

@implementation SimDispatchData
SIM_OBJC_STATE(std::string)
SIM_OBJC_RETAIN_COUNT(std::string)
@end

std::string sim::metal::bytesOf(dispatch_data_t data) {
  return sim::objc::state<std::string>(data);
}

dispatch_queue_main_t dispatch_get_main_queue(void) {
  static dispatch_queue_t main_queue = dispatch_queue_create("main", DISPATCH_QUEUE_SERIAL);
  return reinterpret_cast<dispatch_queue_main_t>(main_queue);
}

// A copy of the bytes: the destructor has nothing to free. v2.9.1's bundled
// shader library never releases the data it makes (once per process), so
// each one is also kept here, where LeakSanitizer can reach it.
dispatch_data_t dispatch_data_create(const void* buffer,
                                     size_t size,
                                     dispatch_queue_t queue,
                                     dispatch_block_t destructor) {
  static auto* made = new std::vector<SimDispatchData*>();
  static std::mutex made_mu;
  SimDispatchData* data = [SimDispatchData alloc];
  sim::objc::state<std::string>(data).assign(static_cast<const char*>(buffer), size);
  std::lock_guard<std::mutex> lock(made_mu);
  made->push_back(data);
  return data;
}
