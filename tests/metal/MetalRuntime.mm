// The simulated Metal framework and MPSCommandBuffer; see SimMetalRuntime.h.
// Only what the glue calls is implemented; any other selector fails at run
// time as unrecognised, so nothing is silently faked.

#include "SimMetalRuntime.h"
#include "SimObjC.h"

#include <ATen/mps/MPSThreadAnnotations.h>
#include <Metal/Metal.h>
#include <MetalPerformanceShaders/MetalPerformanceShaders.h>
#include <mach/vm_page_size.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace sim::metal {
namespace {

using at::mps::Mutex;
using at::mps::MutexLock;
using objc::HeldBlock;
using objc::state;

struct Runtime {
  Mutex mu;
  RuntimeConfig config MPS_GUARDED_BY(mu);
  bool started MPS_GUARDED_BY(mu) = false;
};

Runtime& runtime() {
  static Runtime* r = new Runtime(); // leaked with the device
  return *r;
}

RuntimeConfig startedConfig() {
  Runtime& r = runtime();
  MutexLock lock(r.mu);
  r.started = true;
  return r.config;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "simulated Metal: %s\n", what.c_str());
  std::abort();
}

// How long newLibraryWithSource: compiles, so that threads asking for one
// library at once overlap.
constexpr std::chrono::milliseconds kCompileTime{2};

// The size a buffer takes in a heap.
constexpr NSUInteger kBufferAlignment = 256;

NSUInteger alignUp(NSUInteger size, NSUInteger alignment) {
  return (size + alignment - 1) / alignment * alignment;
}

struct DeviceState {
  // Bytes in live heaps (MTLDevice.currentAllocatedSize).
  std::atomic<uint64_t> allocated{0};
};

struct QueueState {
  QueuePtr queue;
  id<MTLDevice> device = nil;
};

struct BufferState {
  BufferPtr buffer;
  id<MTLDevice> device = nil;
  MTLStorageMode storage_mode = MTLStorageModeShared;
  MTLPurgeableState purgeable = MTLPurgeableStateNonVolatile;
};

struct HeapState {
  id<MTLDevice> device = nil; // set with size by newHeapWithDescriptor:
  NSUInteger size = 0;
  MTLStorageMode storage_mode = MTLStorageModeShared;
  Mutex mu;
  MTLPurgeableState purgeable MPS_GUARDED_BY(mu) = MTLPurgeableStateNonVolatile;
  // A buffer's space returns to the heap when the sim::Buffer goes: after
  // its owner released it and the command buffers using it completed.
  std::vector<std::pair<std::weak_ptr<Buffer>, NSUInteger>> buffers MPS_GUARDED_BY(mu);

  NSUInteger used() MPS_REQUIRES(mu) {
    NSUInteger total = 0;
    auto live = buffers.begin();
    for (auto& b : buffers) {
      if (!b.first.expired()) {
        total += b.second;
        *live++ = std::move(b);
      }
    }
    buffers.erase(live, buffers.end());
    return total;
  }
  ~HeapState() {
    if (device != nil) {
      objc::state<DeviceState>(device).allocated.fetch_sub(size);
    }
  }
};

struct SharedEventState {
  SharedEventPtr event;
  id<MTLDevice> device = nil;
};

struct CommandBufferState {
  CommandBufferPtr buffer;
  id<MTLCommandQueue> queue = nil;
  ~CommandBufferState() {
    [queue release];
  }
};

// The root command buffer a completed handler receives.
struct CompletedState {
  Status status;
};

// How a kernel uses each buffer argument, by index: read only when the
// shader declares it `constant` or `const device`, else written.
using Arguments = std::map<NSUInteger, Access>;

// A compiled function, as its MTLFunction, pipeline state and the encoder
// that last set that pipeline carry it.
struct KernelFunction {
  std::string name;
  Arguments arguments;
};

struct ComputeEncoderState {
  EncoderPtr encoder;
  id<MTLDevice> device = nil;
  std::map<NSUInteger, id<MTLBuffer>> bound; // retained while bound
  // Buffers the kernels reach through an argument buffer, made resident by
  // useResource:usage: for the rest of the pass (retained until then).
  std::vector<std::pair<id<MTLBuffer>, Access>> resident;
  std::function<void()> next_body; // set by dispatchKernel()
  KernelFunction function; // of the pipeline state set last
  void unbindAll() {
    for (auto& [index, buffer] : bound) {
      [buffer release];
    }
    bound.clear();
    for (auto& [buffer, access] : resident) {
      [buffer release];
    }
    resident.clear();
  }
  ~ComputeEncoderState() {
    unbindAll();
  }
};

struct BlitEncoderState {
  EncoderPtr encoder;
  id<MTLDevice> device = nil;
};

// The shader compiler's objects. Every library, function and pipeline state
// belongs to the process-lifetime device, so none retains it.
struct CompileOptionsState {
  MTLLanguageVersion language = MTLLanguageVersion3_0;
  MTLMathMode math_mode = MTLMathModeSafe;
  MTLMathFloatingPointFunctions math_functions = MTLMathFloatingPointFunctionsPrecise;
  BOOL fast_math = NO;
};

struct LibraryState {
  id<MTLDevice> device = nil;
  std::map<std::string, Arguments> functions;
};

struct FunctionState {
  id<MTLDevice> device = nil;
  KernelFunction function;
};

struct PipelineState {
  id<MTLDevice> device = nil;
  KernelFunction function;
};

struct Compiler {
  Mutex mu;
  std::map<std::string, KernelBody> kernels MPS_GUARDED_BY(mu);
  std::atomic<int> libraries{0};
  std::atomic<int> pipelines{0};
};

Compiler& compiler() {
  static Compiler* c = new Compiler(); // leaked with the device
  return *c;
}

std::atomic<int64_t> event_waits{0}; // see eventWaits()

// The buffer arguments of the parameter list that starts at text[begin]:
// the pointer and reference parameters, numbered in order (the test shaders
// give no [[buffer(N)]] indices).
Arguments argumentsOf(const std::string& text, size_t begin) {
  Arguments arguments;
  NSUInteger next = 0;
  int depth = 0;
  std::string param;
  for (size_t i = begin; i < text.size() && depth >= 0; ++i) {
    const char c = text[i];
    depth += (c == '(' || c == '[') - (c == ')' || c == ']');
    if ((c == ',' && depth == 0) || depth < 0) {
      static const std::regex read_only("^\\s*(constant\\b|const\\s+device\\b|device\\s+const\\b)");
      if (param.find_first_of("*&") != std::string::npos) {
        arguments[next++] = std::regex_search(param, read_only) ? Access::kRead : Access::kWrite;
      }
      param.clear();
    } else {
      param += c;
    }
  }
  return arguments;
}

struct HeapDescriptorState {
  NSUInteger size = 0;
  MTLStorageMode storage_mode = MTLStorageModePrivate;
};

struct Stateless {};

MTLCommandBufferStatus statusOf(RootState s) {
  switch (s) {
    case RootState::kOpen:
      return MTLCommandBufferStatusNotEnqueued;
    case RootState::kCommitted:
      return MTLCommandBufferStatusCommitted;
    case RootState::kCompleted:
      return MTLCommandBufferStatusCompleted;
    case RootState::kError:
      return MTLCommandBufferStatusError;
  }
  return MTLCommandBufferStatusError;
}

SharedEventPtr sharedEventOf(id<MTLEvent> event);

} // namespace
} // namespace sim::metal

using namespace sim;
using namespace sim::metal;

// ---------------------------------------------------------------- buffers

@interface SimMTLBuffer : NSObject<MTLBuffer>
@end

@implementation SimMTLBuffer
SIM_OBJC_STATE(BufferState)
// Owners' references plus one per command buffer still holding the buffer,
// as Metal's retained references count them.
- (NSUInteger)retainCount {
  return sim::objc::retainCount<BufferState>(self) + state<BufferState>(self).buffer->retainCount() - 1;
}
- (id<MTLDevice>)device {
  return state<BufferState>(self).device;
}
- (MTLStorageMode)storageMode {
  return state<BufferState>(self).storage_mode;
}
- (MTLPurgeableState)setPurgeableState:(MTLPurgeableState)purgeable {
  auto& s = state<BufferState>(self);
  const MTLPurgeableState previous = s.purgeable;
  if (purgeable != MTLPurgeableStateKeepCurrent) {
    s.purgeable = purgeable;
  }
  return previous;
}
- (NSUInteger)length {
  return state<BufferState>(self).buffer->bytes();
}
- (uint64_t)gpuAddress {
  return state<BufferState>(self).buffer->id();
}
- (void*)contents {
  auto& s = state<BufferState>(self);
  if (s.storage_mode == MTLStorageModePrivate) {
    fail("contents of a private buffer");
  }
  return s.buffer->contents();
}
@end

namespace {
SimMTLBuffer* newSimBuffer(BufferPtr buffer, id<MTLDevice> device, MTLResourceOptions options) {
  SimMTLBuffer* result = [SimMTLBuffer alloc];
  auto& b = state<BufferState>(result);
  b.buffer = std::move(buffer);
  b.device = device;
  b.storage_mode = (MTLStorageMode)((options >> MTLResourceStorageModeShift) & 0xf);
  return result;
}
} // namespace

@interface SimMTLHeap : NSObject<MTLHeap>
@end

@implementation SimMTLHeap
SIM_OBJC_STATE(HeapState)
SIM_OBJC_RETAIN_COUNT(HeapState)
- (id<MTLDevice>)device {
  return state<HeapState>(self).device;
}
- (NSUInteger)size {
  return state<HeapState>(self).size;
}
- (NSUInteger)currentAllocatedSize {
  auto& s = state<HeapState>(self);
  MutexLock lock(s.mu);
  return s.used();
}
- (NSUInteger)maxAvailableSizeWithAlignment:(NSUInteger)alignment {
  auto& s = state<HeapState>(self);
  MutexLock lock(s.mu);
  return (s.size - s.used()) / alignment * alignment;
}
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options {
  auto& s = state<HeapState>(self);
  const NSUInteger size = alignUp(length, kBufferAlignment);
  BufferPtr buffer;
  {
    MutexLock lock(s.mu);
    if (length == 0 || size > s.size - s.used()) {
      return nil;
    }
    buffer = device().newBuffer(0, length);
    s.buffers.emplace_back(buffer, size);
  }
  return newSimBuffer(std::move(buffer), s.device, options);
}
- (MTLPurgeableState)setPurgeableState:(MTLPurgeableState)purgeable {
  auto& s = state<HeapState>(self);
  MutexLock lock(s.mu);
  const MTLPurgeableState previous = s.purgeable;
  if (purgeable != MTLPurgeableStateKeepCurrent) {
    s.purgeable = purgeable;
  }
  return previous;
}
@end

@implementation MTLHeapDescriptor
SIM_OBJC_STATE(HeapDescriptorState)
SIM_OBJC_RETAIN_COUNT(HeapDescriptorState)
- (NSUInteger)size {
  return state<HeapDescriptorState>(self).size;
}
- (void)setSize:(NSUInteger)size {
  state<HeapDescriptorState>(self).size = size;
}
- (MTLStorageMode)storageMode {
  return state<HeapDescriptorState>(self).storage_mode;
}
- (void)setStorageMode:(MTLStorageMode)mode {
  state<HeapDescriptorState>(self).storage_mode = mode;
}
// Set by the allocator; the simulated heap does not model them.
- (void)setCpuCacheMode:(MTLCPUCacheMode)mode {
}
- (void)setHazardTrackingMode:(MTLHazardTrackingMode)mode {
}
- (void)setResourceOptions:(MTLResourceOptions)options {
}
- (void)setType:(MTLHeapType)type {
}
@end

// ---------------------------------------------------------------- events

@interface SimMTLSharedEvent : NSObject<MTLSharedEvent>
@end

@implementation SimMTLSharedEvent
SIM_OBJC_STATE(SharedEventState)
SIM_OBJC_RETAIN_COUNT(SharedEventState)
- (id<MTLDevice>)device {
  return state<SharedEventState>(self).device;
}
- (uint64_t)signaledValue {
  return state<SharedEventState>(self).event->signaledValue();
}
- (void)setSignaledValue:(uint64_t)value {
  state<SharedEventState>(self).event->setSignaledValue(value);
}
// The block runs on the simulator's listener thread. The event is passed to
// it unretained: the glue's blocks ignore it, and retaining it would keep an
// event whose value is never reached alive forever.
- (void)notifyListener:(MTLSharedEventListener*)listener
               atValue:(uint64_t)value
                 block:(MTLSharedEventNotificationBlock)block {
  event_waits.fetch_add(1);
  HeldBlock<MTLSharedEventNotificationBlock> held(block);
  id<MTLSharedEvent> event = self;
  state<SharedEventState>(self).event->notifyListener(value, [held, event](uint64_t reached) {
    @autoreleasepool {
      held.get()(event, reached);
    }
  });
}
@end

// One listener thread per simulated device serves every listener.
@implementation MTLSharedEventListener
SIM_OBJC_STATE(Stateless)
SIM_OBJC_RETAIN_COUNT(Stateless)
@end

namespace sim::metal {
namespace {
SharedEventPtr sharedEventOf(id<MTLEvent> event) {
  if (![(id)event isKindOfClass:[SimMTLSharedEvent class]]) {
    fail("an event that is not a simulated MTLSharedEvent");
  }
  return state<SharedEventState>(event).event;
}
} // namespace
} // namespace sim::metal

// ---------------------------------------------------------------- encoders

@interface SimComputeEncoder : NSObject<MTLComputeCommandEncoder>
@end

@implementation SimComputeEncoder
SIM_OBJC_STATE(ComputeEncoderState)
SIM_OBJC_RETAIN_COUNT(ComputeEncoderState)
- (id<MTLDevice>)device {
  return state<ComputeEncoderState>(self).device;
}
// Debug groups label commands for Apple's tools and change nothing the
// simulator models.
- (void)pushDebugGroup:(NSString*)string {
}
- (void)popDebugGroup {
}
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index {
  auto& s = state<ComputeEncoderState>(self);
  id<MTLBuffer>& slot = s.bound[index];
  [buffer retain];
  [slot release];
  slot = buffer;
}
- (void)useResource:(id<MTLResource>)resource usage:(MTLResourceUsage)usage {
  id<MTLBuffer> buffer = (id<MTLBuffer>)resource;
  [buffer retain];
  state<ComputeEncoderState>(self).resident.emplace_back(
      buffer, (usage & MTLResourceUsageWrite) != 0 ? Access::kWrite : Access::kRead);
}
// Threadgroup memory is the kernel's own scratch, not a buffer.
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index {
}
- (void)setComputePipelineState:(id<MTLComputePipelineState>)pipeline {
  state<ComputeEncoderState>(self).function = state<PipelineState>(pipeline).function;
}
// Constant arguments are not buffers: the hazard detector has nothing to
// see. They take the index's place, so a buffer bound there before (by an
// earlier dispatch of the pass) is no longer an argument.
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index {
  auto& s = state<ComputeEncoderState>(self);
  const auto slot = s.bound.find(index);
  if (slot != s.bound.end()) {
    [slot->second release];
    s.bound.erase(slot);
  }
}
// The body is dispatchKernel()'s, else the one defineKernel() gave the
// pipeline's function, else none. A buffer counts as written unless the
// pipeline's function declares its argument read-only; a resident one as
// its usage says. A compiled function's kernel reaches only the arguments
// it declares: a buffer an earlier dispatch left bound at another index is
// not one of its uses.
- (void)dispatchKernel {
  auto& s = state<ComputeEncoderState>(self);
  const bool compiled = !s.next_body && !s.function.name.empty();
  Kernel kernel;
  for (auto& [index, buffer] : s.bound) {
    const auto declared = s.function.arguments.find(index);
    if (compiled && declared == s.function.arguments.end()) {
      continue;
    }
    kernel.uses.emplace_back(bufferOf(buffer),
                             declared == s.function.arguments.end() ? Access::kWrite : declared->second);
  }
  for (auto& [buffer, access] : s.resident) {
    kernel.uses.emplace_back(bufferOf(buffer), access);
  }
  kernel.body = std::move(s.next_body);
  s.next_body = nullptr;
  if (!kernel.body && !s.function.name.empty()) {
    Compiler& c = compiler();
    MutexLock lock(c.mu);
    auto defined = c.kernels.find(s.function.name);
    if (defined != c.kernels.end()) {
      std::vector<BufferPtr> buffers; // bound in index order, then the resident ones
      for (const auto& use : kernel.uses) {
        buffers.push_back(use.first);
      }
      kernel.body = [body = defined->second, buffers = std::move(buffers)] { body(buffers); };
    }
  }
  s.encoder->dispatch(std::move(kernel));
}
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup {
  [self dispatchKernel];
}
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup {
  [self dispatchKernel];
}
- (void)endEncoding {
  auto& s = state<ComputeEncoderState>(self);
  s.encoder->endEncoding();
  s.unbindAll();
}
@end

@interface SimBlitEncoder : NSObject<MTLBlitCommandEncoder>
@end

@implementation SimBlitEncoder
SIM_OBJC_STATE(BlitEncoderState)
SIM_OBJC_RETAIN_COUNT(BlitEncoderState)
- (id<MTLDevice>)device {
  return state<BlitEncoderState>(self).device;
}
// Debug groups: as SimComputeEncoder's.
- (void)pushDebugGroup:(NSString*)string {
}
- (void)popDebugGroup {
}
- (void)fillBuffer:(id<MTLBuffer>)buffer range:(NSRange)range value:(uint8_t)value {
  BufferPtr b = bufferOf(buffer);
  if (range.location + range.length > b->bytes()) {
    fail("fillBuffer range beyond the buffer");
  }
  state<BlitEncoderState>(self).encoder->dispatch(
      {{{b, Access::kWrite}}, [b, range, value] { std::memset(b->contents() + range.location, value, range.length); }});
}
- (void)copyFromBuffer:(id<MTLBuffer>)sourceBuffer
          sourceOffset:(NSUInteger)sourceOffset
              toBuffer:(id<MTLBuffer>)destinationBuffer
     destinationOffset:(NSUInteger)destinationOffset
                  size:(NSUInteger)size {
  BufferPtr src = bufferOf(sourceBuffer);
  BufferPtr dst = bufferOf(destinationBuffer);
  if (sourceOffset + size > src->bytes() || destinationOffset + size > dst->bytes()) {
    fail("copyFromBuffer range beyond a buffer");
  }
  state<BlitEncoderState>(self).encoder->dispatch(
      {{{src, Access::kRead}, {dst, Access::kWrite}}, [src, dst, sourceOffset, destinationOffset, size] {
         std::memmove(dst->contents() + destinationOffset, src->contents() + sourceOffset, size);
       }});
}
- (void)endEncoding {
  state<BlitEncoderState>(self).encoder->endEncoding();
}
@end

// ---------------------------------------------------------------- command buffers

@interface SimCompletedCommandBuffer : NSObject<MTLCommandBuffer>
@end

@implementation SimCompletedCommandBuffer
SIM_OBJC_STATE(CompletedState)
SIM_OBJC_RETAIN_COUNT(CompletedState)
// GPU and kernel times are not simulated: each reads 0, which the MPS
// profiler reports as no time.
- (CFTimeInterval)kernelStartTime {
  return 0;
}
- (CFTimeInterval)kernelEndTime {
  return 0;
}
- (CFTimeInterval)GPUStartTime {
  return 0;
}
- (CFTimeInterval)GPUEndTime {
  return 0;
}
- (MTLCommandBufferStatus)status {
  return state<CompletedState>(self).status.ok ? MTLCommandBufferStatusCompleted : MTLCommandBufferStatusError;
}
- (NSError*)error {
  const Status& status = state<CompletedState>(self).status;
  if (status.ok) {
    return nil;
  }
  NSString* message = [NSString stringWithUTF8String:status.error.c_str()];
  return [NSError errorWithDomain:@"MTLCommandBufferErrorDomain"
                             code:1
                         userInfo:[NSDictionary dictionaryWithObject:message forKey:NSLocalizedDescriptionKey]];
}
@end

@implementation MPSCommandBuffer
SIM_OBJC_STATE(CommandBufferState)
SIM_OBJC_RETAIN_COUNT(CommandBufferState)
// Blocks while the queue has the maximum of uncompleted command buffers.
+ (instancetype)commandBufferFromCommandQueue:(id<MTLCommandQueue>)commandQueue {
  MPSCommandBuffer* result = [self alloc];
  auto& s = state<CommandBufferState>(result);
  s.queue = [commandQueue retain];
  s.buffer = queueOf(commandQueue).makeCommandBuffer();
  return [result autorelease];
}
- (id<MTLDevice>)device {
  return [state<CommandBufferState>(self).queue device];
}
- (id<MTLCommandQueue>)commandQueue {
  return state<CommandBufferState>(self).queue;
}
- (MTLCommandBufferStatus)status {
  return statusOf(state<CommandBufferState>(self).buffer->root()->state());
}
- (void)commit {
  state<CommandBufferState>(self).buffer->commit();
}
- (void)commitAndContinue {
  state<CommandBufferState>(self).buffer->commitAndContinue();
}
- (void)waitUntilCompleted {
  state<CommandBufferState>(self).buffer->waitUntilCompleted();
}
// Joins the current root; runs on the simulator's completion thread with
// that root, as Metal passes the underlying command buffer.
- (void)addCompletedHandler:(MTLCommandBufferHandler)block {
  HeldBlock<MTLCommandBufferHandler> held(block);
  state<CommandBufferState>(self).buffer->addCompletedHandler([held](const Status& status) {
    @autoreleasepool {
      SimCompletedCommandBuffer* root = [SimCompletedCommandBuffer alloc];
      state<CompletedState>(root).status = status;
      held.get()(root);
      [root release];
    }
  });
}
// The simulator has no scheduling step: a scheduled handler runs with the
// completed handlers of its root, in the order they were added (Metal runs
// it earlier, once the buffer is scheduled), on the same thread.
- (void)addScheduledHandler:(MTLCommandBufferHandler)block {
  [self addCompletedHandler:block];
}
- (id<MTLComputeCommandEncoder>)computeCommandEncoder {
  SimComputeEncoder* encoder = [SimComputeEncoder alloc];
  auto& s = state<ComputeEncoderState>(encoder);
  s.encoder = state<CommandBufferState>(self).buffer->computeEncoder();
  s.device = [self device];
  return [encoder autorelease];
}
// A blit pass is one more encoder pass of the simulated command buffer.
- (id<MTLBlitCommandEncoder>)blitCommandEncoder {
  SimBlitEncoder* encoder = [SimBlitEncoder alloc];
  auto& s = state<BlitEncoderState>(encoder);
  s.encoder = state<CommandBufferState>(self).buffer->computeEncoder();
  s.device = [self device];
  return [encoder autorelease];
}
- (void)encodeSignalEvent:(id<MTLEvent>)event value:(uint64_t)value {
  state<CommandBufferState>(self).buffer->encodeSignal(sharedEventOf(event), value);
}
- (void)encodeWaitForEvent:(id<MTLEvent>)event value:(uint64_t)value {
  event_waits.fetch_add(1);
  state<CommandBufferState>(self).buffer->encodeWait(sharedEventOf(event), value);
}
@end

// ---------------------------------------------------------------- queue, device

@interface SimMTLCommandQueue : NSObject<MTLCommandQueue>
@end

@implementation SimMTLCommandQueue
SIM_OBJC_STATE(QueueState)
SIM_OBJC_RETAIN_COUNT(QueueState)
- (id<MTLDevice>)device {
  return state<QueueState>(self).device;
}
- (id<MTLCommandBuffer>)commandBuffer {
  return [MPSCommandBuffer commandBufferFromCommandQueue:self];
}
@end

// ---------------------------------------------------------------- shader compiler

NSErrorDomain const MTLLibraryErrorDomain = @"MTLLibraryErrorDomain";

@implementation MTLCompileOptions
SIM_OBJC_STATE(CompileOptionsState)
SIM_OBJC_RETAIN_COUNT(CompileOptionsState)
- (id)copyWithZone:(NSZone*)zone {
  MTLCompileOptions* copy = [[MTLCompileOptions allocWithZone:zone] init];
  state<CompileOptionsState>(copy) = state<CompileOptionsState>(self);
  return copy;
}
- (MTLLanguageVersion)languageVersion {
  return state<CompileOptionsState>(self).language;
}
- (void)setLanguageVersion:(MTLLanguageVersion)version {
  state<CompileOptionsState>(self).language = version;
}
- (MTLMathMode)mathMode {
  return state<CompileOptionsState>(self).math_mode;
}
- (void)setMathMode:(MTLMathMode)mode {
  state<CompileOptionsState>(self).math_mode = mode;
}
- (MTLMathFloatingPointFunctions)mathFloatingPointFunctions {
  return state<CompileOptionsState>(self).math_functions;
}
- (void)setMathFloatingPointFunctions:(MTLMathFloatingPointFunctions)functions {
  state<CompileOptionsState>(self).math_functions = functions;
}
- (BOOL)fastMathEnabled {
  return state<CompileOptionsState>(self).fast_math;
}
- (void)setFastMathEnabled:(BOOL)enabled {
  state<CompileOptionsState>(self).fast_math = enabled;
}
@end

@interface SimMTLFunction : NSObject<MTLFunction>
@end

@implementation SimMTLFunction
SIM_OBJC_STATE(FunctionState)
SIM_OBJC_RETAIN_COUNT(FunctionState)
- (id<MTLDevice>)device {
  return state<FunctionState>(self).device;
}
- (NSString*)name {
  return [NSString stringWithUTF8String:state<FunctionState>(self).function.name.c_str()];
}
@end

@interface SimMTLLibrary : NSObject<MTLLibrary>
@end

@implementation SimMTLLibrary
SIM_OBJC_STATE(LibraryState)
SIM_OBJC_RETAIN_COUNT(LibraryState)
- (id<MTLDevice>)device {
  return state<LibraryState>(self).device;
}
- (NSArray<NSString*>*)functionNames {
  NSMutableArray<NSString*>* names = [NSMutableArray array];
  for (const auto& [name, arguments] : state<LibraryState>(self).functions) {
    [names addObject:[NSString stringWithUTF8String:name.c_str()]];
  }
  return names;
}
- (id<MTLFunction>)newFunctionWithName:(NSString*)name {
  const auto& s = state<LibraryState>(self);
  const std::string wanted = [name UTF8String];
  const auto found = s.functions.find(wanted);
  if (found == s.functions.end()) {
    return nil;
  }
  SimMTLFunction* function = [SimMTLFunction alloc];
  state<FunctionState>(function).device = s.device;
  state<FunctionState>(function).function = {wanted, found->second};
  return function;
}
@end

@interface SimMTLComputePipelineState : NSObject<MTLComputePipelineState>
@end

@implementation SimMTLComputePipelineState
SIM_OBJC_STATE(PipelineState)
SIM_OBJC_RETAIN_COUNT(PipelineState)
- (id<MTLDevice>)device {
  return state<PipelineState>(self).device;
}
- (NSUInteger)maxTotalThreadsPerThreadgroup {
  return 1024;
}
- (NSUInteger)threadExecutionWidth {
  return 32;
}
- (NSUInteger)staticThreadgroupMemoryLength {
  return 0;
}
@end

@interface SimMTLDevice : NSObject<MTLDevice>
@end

@implementation SimMTLDevice
SIM_OBJC_STATE(DeviceState)
SIM_OBJC_RETAIN_COUNT(DeviceState)
- (NSString*)name {
  return @"Simulated GPU (tests/sim)";
}
- (uint64_t)recommendedMaxWorkingSetSize {
  return startedConfig().working_set_bytes;
}
- (NSUInteger)currentAllocatedSize {
  return state<DeviceState>(self).allocated.load();
}
- (NSUInteger)maxBufferLength {
  return NSUInteger{1} << 36;
}
- (BOOL)hasUnifiedMemory {
  return YES;
}
// nil while a queue-creation fault is armed.
- (id<MTLCommandQueue>)newCommandQueue {
  QueuePtr queue = device().newCommandQueue();
  if (!queue) {
    return nil;
  }
  SimMTLCommandQueue* result = [SimMTLCommandQueue alloc];
  state<QueueState>(result).queue = std::move(queue);
  state<QueueState>(result).device = self;
  return result;
}
- (MTLSizeAndAlign)heapBufferSizeAndAlignWithLength:(NSUInteger)length options:(MTLResourceOptions)options {
  return {alignUp(length, kBufferAlignment), kBufferAlignment};
}
- (id<MTLHeap>)newHeapWithDescriptor:(MTLHeapDescriptor*)descriptor {
  const NSUInteger size = descriptor.size;
  std::atomic<uint64_t>& allocated = state<DeviceState>(self).allocated;
  uint64_t now = allocated.load();
  do {
    if (now + size > startedConfig().memory_bytes) {
      return nil;
    }
  } while (!allocated.compare_exchange_weak(now, now + size));
  SimMTLHeap* heap = [SimMTLHeap alloc];
  auto& s = state<HeapState>(heap);
  s.device = self;
  s.size = size;
  s.storage_mode = descriptor.storageMode;
  return heap;
}
// A buffer over the caller's memory, which Metal requires to be a
// page-aligned region; the caller keeps it alive (this stand-in takes no
// deallocator).
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void*)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(void (^)(void* pointer, NSUInteger length))deallocator {
  if (pointer == nullptr || length == 0 || reinterpret_cast<uintptr_t>(pointer) % vm_page_size != 0 ||
      length % vm_page_size != 0) {
    fail("newBufferWithBytesNoCopy: of a region that is not page-aligned");
  }
  if (deallocator != nil) {
    fail("newBufferWithBytesNoCopy: with a deallocator");
  }
  return newSimBuffer(device().newBuffer(0, length, static_cast<unsigned char*>(pointer)), self, options);
}
- (id<MTLSharedEvent>)newSharedEvent {
  SimMTLSharedEvent* event = [SimMTLSharedEvent alloc];
  state<SharedEventState>(event).event = device().newSharedEvent();
  state<SharedEventState>(event).device = self;
  return event;
}
// The bundled library, compiled from its text (setBundledShaderSource()).
- (id<MTLLibrary>)newLibraryWithData:(dispatch_data_t)data error:(NSError**)error {
  return [self newLibraryWithSource:[NSString stringWithUTF8String:bytesOf(data).c_str()] options:nil error:error];
}
// The shader compiler of SimMetalRuntime.h.
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source options:(MTLCompileOptions*)options error:(NSError**)error {
  compiler().libraries.fetch_add(1);
  std::this_thread::sleep_for(kCompileTime);
  const std::string text = [source UTF8String];
  std::smatch m;
  static const std::regex error_line("#error ([^\n]*)");
  if (std::regex_search(text, m, error_line)) {
    if (error != nullptr) {
      NSString* message = [NSString stringWithUTF8String:m[1].str().c_str()];
      *error = [NSError errorWithDomain:MTLLibraryErrorDomain
                                   code:MTLLibraryErrorCompileFailure
                               userInfo:[NSDictionary dictionaryWithObject:message forKey:NSLocalizedDescriptionKey]];
    }
    return nil;
  }
  SimMTLLibrary* library = [SimMTLLibrary alloc];
  auto& s = state<LibraryState>(library);
  s.device = self;
  static const std::regex kernel("kernel\\s+void\\s+(\\w+)\\s*\\(");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kernel); it != std::sregex_iterator(); ++it) {
    s.functions[(*it)[1].str()] = argumentsOf(text, it->position() + it->length());
  }
  return library;
}
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)function error:(NSError**)error {
  compiler().pipelines.fetch_add(1);
  SimMTLComputePipelineState* pipeline = [SimMTLComputePipelineState alloc];
  state<PipelineState>(pipeline).device = self;
  state<PipelineState>(pipeline).function = state<FunctionState>(function).function;
  return pipeline;
}
@end

// ---------------------------------------------------------------- capture

// No capture tool is attached to the simulator: the capture manager supports
// no destination, so the profiler never starts a capture and the descriptor
// class exists only for the link.
@implementation MTLCaptureDescriptor
SIM_OBJC_STATE(Stateless)
SIM_OBJC_RETAIN_COUNT(Stateless)
@end

@implementation MTLCaptureManager
SIM_OBJC_STATE(Stateless)
SIM_OBJC_RETAIN_COUNT(Stateless)
+ (MTLCaptureManager*)sharedCaptureManager {
  static MTLCaptureManager* manager = [[MTLCaptureManager alloc] init];
  return manager;
}
- (BOOL)supportsDestination:(MTLCaptureDestination)destination {
  return NO;
}
- (BOOL)isCapturing {
  return NO;
}
@end

// ---------------------------------------------------------------- entry points

extern "C" id<MTLDevice> MTLCreateSystemDefaultDevice(void) {
  static SimMTLDevice* device = [SimMTLDevice alloc]; // lives for the process
  return [device retain];
}

namespace sim::metal {

void configure(const RuntimeConfig& config) {
  Runtime& r = runtime();
  MutexLock lock(r.mu);
  if (r.started) {
    fail("configure() after the device started");
  }
  r.config = config;
}

Device& device() {
  static Device* d = new Device(startedConfig().gpu); // lives for the process
  return *d;
}

BufferPtr bufferOf(id<MTLBuffer> buffer) {
  if (![(id)buffer isKindOfClass:[SimMTLBuffer class]]) {
    fail("a buffer that is not a simulated MTLBuffer");
  }
  return state<BufferState>(buffer).buffer;
}

Queue& queueOf(id<MTLCommandQueue> queue) {
  return *state<QueueState>(queue).queue;
}

CommandBufferPtr commandBufferOf(id<MTLCommandBuffer> commandBuffer) {
  if (![(id)commandBuffer isKindOfClass:[MPSCommandBuffer class]]) {
    fail("a command buffer that is not a simulated MPSCommandBuffer");
  }
  return state<CommandBufferState>(commandBuffer).buffer;
}

void dispatchKernel(id<MTLComputeCommandEncoder> encoder,
                    const std::vector<id<MTLBuffer>>& buffers,
                    std::function<void()> body) {
  for (NSUInteger i = 0; i < buffers.size(); ++i) {
    [encoder setBuffer:buffers[i] offset:0 atIndex:i];
  }
  state<ComputeEncoderState>(encoder).next_body = std::move(body);
  [encoder dispatchThreads:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(1, 1, 1)];
}

void dispatchKernel(id<MTLComputeCommandEncoder> encoder, Kernel kernel) {
  state<ComputeEncoderState>(encoder).encoder->dispatch(std::move(kernel));
}

void defineKernel(const std::string& function, KernelBody body) {
  Compiler& c = compiler();
  MutexLock lock(c.mu);
  c.kernels[function] = std::move(body);
}

CompilerCounts compilerCounts() {
  return {compiler().libraries.load(), compiler().pipelines.load()};
}

int64_t eventWaits() {
  return event_waits.load();
}

} // namespace sim::metal
