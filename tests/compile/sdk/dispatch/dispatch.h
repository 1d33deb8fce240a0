// Declaration-only stand-in for <dispatch/dispatch.h>, written from Apple's
// public documentation for a syntax check on Linux; not Apple's header.
#pragma once
#include <os/object.h>
#include <stddef.h>
#include <stdint.h>

STANDIN_OS_OBJECT_DECL(dispatch_object, object);
STANDIN_OS_OBJECT_DECL(dispatch_queue, dispatch_object);
STANDIN_OS_OBJECT_DECL(dispatch_queue_attr, dispatch_object);
STANDIN_OS_OBJECT_DECL(dispatch_queue_main, dispatch_queue);
STANDIN_OS_OBJECT_DECL(dispatch_data, dispatch_object);

typedef void (*dispatch_function_t)(void*);
#ifdef __BLOCKS__
typedef void (^dispatch_block_t)(void);
#endif

#define DISPATCH_QUEUE_SERIAL NULL
#define DISPATCH_DATA_DESTRUCTOR_DEFAULT NULL

#ifdef __cplusplus
extern "C" {
#endif
dispatch_queue_t dispatch_queue_create(const char* label, dispatch_queue_attr_t attr);
dispatch_queue_main_t dispatch_get_main_queue(void);
void dispatch_sync_f(dispatch_queue_t queue, void* context, dispatch_function_t work);
void dispatch_queue_set_specific(dispatch_queue_t queue,
                                 const void* key,
                                 void* context,
                                 dispatch_function_t destructor);
void* dispatch_get_specific(const void* key);
void dispatch_release(dispatch_object_t object);
#ifdef __BLOCKS__
void dispatch_sync(dispatch_queue_t queue, dispatch_block_t block);
void dispatch_async(dispatch_queue_t queue, dispatch_block_t block);
dispatch_data_t dispatch_data_create(const void* buffer,
                                     size_t size,
                                     dispatch_queue_t queue,
                                     dispatch_block_t destructor);
#endif
#ifdef __cplusplus
}
#endif
