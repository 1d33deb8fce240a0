// Declaration-only stand-in for <os/object.h>, written from Apple's public
// documentation for a syntax check on Linux; not Apple's header.
//
// Apple's OS objects (dispatch queues, logs) are Objective-C objects when the
// translation unit is Objective-C and opaque struct pointers otherwise; both
// forms are declared here because the v2.9.1 headers are compiled both ways.
#pragma once

// clang-format off
#ifdef __OBJC__
#import <Foundation/Foundation.h>
#define STANDIN_OS_OBJECT_DECL(name, base) \
  @protocol OS_##name <OS_##base> @end     \
  typedef NSObject<OS_##name>* name##_t
@protocol OS_object <NSObject>
@end
#else
#define STANDIN_OS_OBJECT_DECL(name, base) \
  struct name##_s : base##_s {};           \
  typedef struct name##_s* name##_t
struct object_s {};
#endif
// clang-format on

void os_release(void* object);
