// main() of the glue tests: configures the simulated device before anything
// creates it, and gives the sanitizers their options (no environment needed,
// so ctest's test discovery runs the same way).

#include "SimMetalRuntime.h"

#include <ATen/detail/MPSHooksInterface.h>

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/lsan_interface.h>
#define GLUE_LSAN 1
#endif
#endif

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
extern "C" const char* __tsan_default_options() {
  return "halt_on_error=1 second_deadlock_stack=1 suppressions=" GLUE_TSAN_SUPPRESSIONS;
}
#endif
#if __has_feature(address_sanitizer)
extern "C" const char* __asan_default_options() {
  return "detect_leaks=1 abort_on_error=1";
}
extern "C" const char* __ubsan_default_options() {
  return "print_stacktrace=1 halt_on_error=1";
}
// GCC's libobjc registers every class, method list and selector of a module
// when the module loads (__objc_exec_class, allocating with objc_malloc) and
// GNUstep copies method lists at start-up (class_copyMethodList); the
// runtime keeps them for the life of the process in tables LeakSanitizer
// does not see as roots. libobjc has no frame pointers, so the allocating
// frame is all the fast unwinder sees. Objective-C objects are not
// allocated there (NSAllocateObject uses the zone's calloc).
extern "C" const char* __lsan_default_suppressions() {
  return "leak:objc_malloc\n"
         "leak:class_copyMethodList\n";
}
#endif
#endif

int main(int argc, char** argv) {
  sim::metal::RuntimeConfig config;
  // GPU work takes time and completions come back out of order, so that
  // missing ordering shows up as a hazard rather than passing by luck.
  config.gpu.min_latency = std::chrono::microseconds(20);
  config.gpu.max_latency = std::chrono::microseconds(300);
  config.gpu.reorder_completions = 0.25;
  config.gpu.widen_encode_windows = true;
  sim::metal::configure(config);
  // Note [Foundation set-up before the test threads]
  // GNUstep creates some shared objects on first use: the Metal device's
  // class set-up, the locks GSCurrentThread() needs for the first thread
  // that NSThread did not start, the notification center that thread's exit
  // posts to, and NSError's tables (a failed command buffer's error). They
  // are published to other threads through GCC's libobjc, which is not
  // instrumented, so when a test thread creates one and another thread then
  // locks it, ThreadSanitizer reports a race inside GNUstep that no test
  // code has. Creating them here, before any test thread exists
  // (pthread_create and join order them for TSan), takes that first use out
  // of the tests in every variant. The first NSDictionary also keeps a
  // 24-byte object that LeakSanitizer cannot reach; made here with leak
  // checking off, it is not reported.
#ifdef GLUE_LSAN
  __lsan_disable();
#endif
  @autoreleasepool {
    [MTLCreateSystemDefaultDevice() release];
    [NSNotificationCenter defaultCenter];
    [NSError errorWithDomain:@"" code:0 userInfo:[NSDictionary dictionaryWithObject:@"" forKey:@""]];
  }
  at::detail::getMPSHooks();
  std::thread([] {
    @autoreleasepool {
      [NSThread currentThread];
    }
  }).join();
#ifdef GLUE_LSAN
  __lsan_enable();
#endif
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
