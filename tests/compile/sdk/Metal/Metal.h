// Declaration-only stand-in for <Metal/Metal.h>, written from Apple's public
// documentation (developer.apple.com/documentation/metal) for a syntax check
// on Linux; not Apple's header. It declares only what PyTorch's MPS sources
// and the stream-pool patch use, with Apple's names and types; nullability
// and availability annotations are left out.
#pragma once
#include <Availability.h>
#include <CoreFoundation/CoreFoundation.h>
#import <Foundation/Foundation.h>
#include <dispatch/dispatch.h>
#include <stdint.h>

@protocol MTLDevice;
@protocol MTLBuffer;
@protocol MTLHeap;
@protocol MTLCommandQueue;
@protocol MTLCommandBuffer;
@protocol MTLSharedEvent;
@protocol MTLFunction;
@protocol MTLLibrary;
@protocol MTLComputePipelineState;
@protocol MTLComputeCommandEncoder;
@protocol MTLBlitCommandEncoder;
@class MTLHeapDescriptor;
@class MTLCompileOptions;
@class MTLSharedEventListener;

// --- Value types ------------------------------------------------------------

typedef struct {
  NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize size = {width, height, depth};
  return size;
}

typedef struct {
  NSUInteger size;
  NSUInteger align;
} MTLSizeAndAlign;

// --- Resource options -------------------------------------------------------

typedef NS_OPTIONS(NSUInteger, MTLResourceUsage) {
  MTLResourceUsageRead = 1 << 0,
  MTLResourceUsageWrite = 1 << 1,
  MTLResourceUsageSample = 1 << 2,
};

typedef NS_ENUM(NSUInteger, MTLCPUCacheMode) {
  MTLCPUCacheModeDefaultCache = 0,
  MTLCPUCacheModeWriteCombined = 1,
};

typedef NS_ENUM(NSUInteger, MTLStorageMode) {
  MTLStorageModeShared = 0,
  MTLStorageModeManaged = 1,
  MTLStorageModePrivate = 2,
  MTLStorageModeMemoryless = 3,
};

typedef NS_ENUM(NSUInteger, MTLHazardTrackingMode) {
  MTLHazardTrackingModeDefault = 0,
  MTLHazardTrackingModeUntracked = 1,
  MTLHazardTrackingModeTracked = 2,
};

#define MTLResourceCPUCacheModeShift 0
#define MTLResourceStorageModeShift 4
#define MTLResourceHazardTrackingModeShift 8

typedef NS_OPTIONS(NSUInteger, MTLResourceOptions) {
  MTLResourceCPUCacheModeDefaultCache = MTLCPUCacheModeDefaultCache << MTLResourceCPUCacheModeShift,
  MTLResourceCPUCacheModeWriteCombined = MTLCPUCacheModeWriteCombined << MTLResourceCPUCacheModeShift,
  MTLResourceStorageModeShared = MTLStorageModeShared << MTLResourceStorageModeShift,
  MTLResourceStorageModeManaged = MTLStorageModeManaged << MTLResourceStorageModeShift,
  MTLResourceStorageModePrivate = MTLStorageModePrivate << MTLResourceStorageModeShift,
  MTLResourceStorageModeMemoryless = MTLStorageModeMemoryless << MTLResourceStorageModeShift,
  MTLResourceHazardTrackingModeDefault = MTLHazardTrackingModeDefault << MTLResourceHazardTrackingModeShift,
  MTLResourceHazardTrackingModeUntracked = MTLHazardTrackingModeUntracked << MTLResourceHazardTrackingModeShift,
  MTLResourceHazardTrackingModeTracked = MTLHazardTrackingModeTracked << MTLResourceHazardTrackingModeShift,
};

typedef NS_ENUM(NSUInteger, MTLPurgeableState) {
  MTLPurgeableStateKeepCurrent = 1,
  MTLPurgeableStateNonVolatile = 2,
  MTLPurgeableStateVolatile = 3,
  MTLPurgeableStateEmpty = 4,
};

typedef NS_ENUM(NSInteger, MTLHeapType) {
  MTLHeapTypeAutomatic = 0,
  MTLHeapTypePlacement = 1,
  MTLHeapTypeSparse = 2,
};

// --- Resources --------------------------------------------------------------

@protocol MTLResource<NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) MTLStorageMode storageMode;
- (MTLPurgeableState)setPurgeableState:(MTLPurgeableState)state;
@end

@protocol MTLBuffer<MTLResource>
@property(readonly) NSUInteger length;
@property(readonly) uint64_t gpuAddress;
- (void*)contents;
@end

@interface MTLHeapDescriptor : NSObject<NSCopying>
@property(readwrite, nonatomic) NSUInteger size;
@property(readwrite, nonatomic) MTLStorageMode storageMode;
@property(readwrite, nonatomic) MTLCPUCacheMode cpuCacheMode;
@property(readwrite, nonatomic) MTLHazardTrackingMode hazardTrackingMode;
@property(readwrite, nonatomic) MTLResourceOptions resourceOptions;
@property(readwrite, nonatomic) MTLHeapType type;
@end

@protocol MTLHeap<NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) NSUInteger size;
@property(readonly) NSUInteger currentAllocatedSize;
- (NSUInteger)maxAvailableSizeWithAlignment:(NSUInteger)alignment;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (MTLPurgeableState)setPurgeableState:(MTLPurgeableState)state;
@end

// --- Events -----------------------------------------------------------------

@protocol MTLEvent<NSObject>
@property(readonly) id<MTLDevice> device;
@end

typedef void (^MTLSharedEventNotificationBlock)(id<MTLSharedEvent>, uint64_t value);

@interface MTLSharedEventListener : NSObject
- (instancetype)init;
@end

@protocol MTLSharedEvent<MTLEvent>
@property(readwrite) uint64_t signaledValue;
- (void)notifyListener:(MTLSharedEventListener*)listener
               atValue:(uint64_t)value
                 block:(MTLSharedEventNotificationBlock)block;
@end

// --- Functions and pipelines ------------------------------------------------

@protocol MTLFunction<NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) NSString* name;
@end

@protocol MTLLibrary<NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) NSArray<NSString*>* functionNames;
- (id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
@end

@protocol MTLComputePipelineState<NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property(readonly) NSUInteger threadExecutionWidth;
@property(readonly) NSUInteger staticThreadgroupMemoryLength;
@end

typedef NS_ENUM(NSUInteger, MTLLanguageVersion) {
  MTLLanguageVersion3_0 = (3 << 16) + 0,
  MTLLanguageVersion3_1 = (3 << 16) + 1,
  MTLLanguageVersion3_2 = (3 << 16) + 2,
};

typedef NS_ENUM(NSInteger, MTLMathMode) {
  MTLMathModeSafe = 0,
  MTLMathModeRelaxed = 1,
  MTLMathModeFast = 2,
};

typedef NS_ENUM(NSInteger, MTLMathFloatingPointFunctions) {
  MTLMathFloatingPointFunctionsFast = 0,
  MTLMathFloatingPointFunctionsPrecise = 1,
};

@interface MTLCompileOptions : NSObject<NSCopying>
@property(readwrite, nonatomic) BOOL fastMathEnabled;
@property(readwrite, nonatomic) MTLMathMode mathMode;
@property(readwrite, nonatomic) MTLMathFloatingPointFunctions mathFloatingPointFunctions;
@property(readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

extern NSErrorDomain const MTLLibraryErrorDomain;

typedef NS_ENUM(NSUInteger, MTLLibraryError) {
  MTLLibraryErrorUnsupported = 1,
  MTLLibraryErrorInternal = 2,
  MTLLibraryErrorCompileFailure = 3,
  MTLLibraryErrorCompileWarning = 4,
  MTLLibraryErrorFunctionNotFound = 5,
  MTLLibraryErrorFileNotFound = 6,
};

// --- Device -----------------------------------------------------------------

@protocol MTLDevice<NSObject>
@property(readonly) NSString* name;
@property(readonly) uint64_t recommendedMaxWorkingSetSize;
@property(readonly) NSUInteger currentAllocatedSize;
@property(readonly) NSUInteger maxBufferLength;
@property(readonly) BOOL hasUnifiedMemory;
- (id<MTLCommandQueue>)newCommandQueue;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void*)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(void (^)(void* pointer, NSUInteger length))deallocator;
- (MTLSizeAndAlign)heapBufferSizeAndAlignWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLHeap>)newHeapWithDescriptor:(MTLHeapDescriptor*)descriptor;
- (id<MTLSharedEvent>)newSharedEvent;
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source options:(MTLCompileOptions*)options error:(NSError**)error;
- (id<MTLLibrary>)newLibraryWithData:(dispatch_data_t)data error:(NSError**)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                             error:(NSError**)error;
@end

#ifdef __cplusplus
extern "C" {
#endif
id<MTLDevice> MTLCreateSystemDefaultDevice(void);
#ifdef __cplusplus
}
#endif

// --- Command submission -----------------------------------------------------

@protocol MTLCommandEncoder<NSObject>
@property(readonly) id<MTLDevice> device;
- (void)endEncoding;
- (void)pushDebugGroup:(NSString*)string;
- (void)popDebugGroup;
@end

@protocol MTLComputeCommandEncoder<MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)useResource:(id<MTLResource>)resource usage:(MTLResourceUsage)usage;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLBlitCommandEncoder<MTLCommandEncoder>
- (void)fillBuffer:(id<MTLBuffer>)buffer range:(NSRange)range value:(uint8_t)value;
- (void)copyFromBuffer:(id<MTLBuffer>)sourceBuffer
          sourceOffset:(NSUInteger)sourceOffset
              toBuffer:(id<MTLBuffer>)destinationBuffer
     destinationOffset:(NSUInteger)destinationOffset
                  size:(NSUInteger)size;
@end

@protocol MTLArgumentEncoder<NSObject>
@property(readonly) id<MTLDevice> device;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
@end

typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus) {
  MTLCommandBufferStatusNotEnqueued = 0,
  MTLCommandBufferStatusEnqueued = 1,
  MTLCommandBufferStatusCommitted = 2,
  MTLCommandBufferStatusScheduled = 3,
  MTLCommandBufferStatusCompleted = 4,
  MTLCommandBufferStatusError = 5,
};

typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);

@protocol MTLCommandBuffer<NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) id<MTLCommandQueue> commandQueue;
@property(readonly) MTLCommandBufferStatus status;
@property(readonly) NSError* error;
@property(readonly) CFTimeInterval kernelStartTime;
@property(readonly) CFTimeInterval kernelEndTime;
@property(readonly) CFTimeInterval GPUStartTime;
@property(readonly) CFTimeInterval GPUEndTime;
- (void)commit;
- (void)waitUntilCompleted;
- (void)addScheduledHandler:(MTLCommandBufferHandler)block;
- (void)addCompletedHandler:(MTLCommandBufferHandler)block;
- (id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (id<MTLBlitCommandEncoder>)blitCommandEncoder;
- (void)encodeSignalEvent:(id<MTLEvent>)event value:(uint64_t)value;
- (void)encodeWaitForEvent:(id<MTLEvent>)event value:(uint64_t)value;
@end

@protocol MTLCommandQueue<NSObject>
@property(readonly) id<MTLDevice> device;
- (id<MTLCommandBuffer>)commandBuffer;
@end

// --- GPU capture ------------------------------------------------------------

typedef NS_ENUM(NSInteger, MTLCaptureDestination) {
  MTLCaptureDestinationDeveloperTools = 1,
  MTLCaptureDestinationGPUTraceDocument = 2,
};

@interface MTLCaptureDescriptor : NSObject<NSCopying>
@property(nonatomic, strong) id captureObject;
@property(nonatomic, assign) MTLCaptureDestination destination;
@property(nonatomic, copy) NSURL* outputURL;
@end

@interface MTLCaptureManager : NSObject
+ (MTLCaptureManager*)sharedCaptureManager;
- (BOOL)supportsDestination:(MTLCaptureDestination)destination;
- (BOOL)startCaptureWithDescriptor:(MTLCaptureDescriptor*)descriptor error:(NSError**)error;
- (void)stopCapture;
@property(readonly) BOOL isCapturing;
@end
