// Stand-in for MPSGraph execution: graphs cannot be compiled or run here, so
// every graph is one kernel that reads the buffers of its feeds and writes
// those of its results (copying the first feed's bytes into each result, or
// its elements converted when the result's data type differs, as a cast),
// encoded in its own compute encoder pass as MPSGraph encodes. With
// enableCommitAndContinue set, it then commits and continues the command
// buffer, which MPSGraph may do for large graphs; here it always does, the
// case the stream's command-buffer bookkeeping finds hardest. Two threads
// encoding one graph at once abort (GraphState).

#include "SimMetalRuntime.h"
#include "SimObjC.h"

#include <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using sim::objc::state;

namespace {

struct Stateless {};

// Concurrent encoding of one MPSGraph is undocumented, so the simulator
// treats it as the race it may be: a second thread entering an encode of a
// graph another thread is encoding aborts. Each encode lasts a while, so
// that overlaps are not missed.
//
// A graph owns the tensors it makes, as MPSGraph does: cached graphs keep
// their placeholders past the autorelease pool they were made in.
struct GraphState {
  std::atomic<int> encoders{0};
  std::vector<MPSGraphTensor*> tensors;
  ~GraphState() {
    for (MPSGraphTensor* t : tensors) {
      [t release];
    }
  }
};
constexpr std::chrono::microseconds kGraphEncodeTime{30};

struct TensorState {
  MPSShape* shape = nil;
  MPSDataType data_type = MPSDataTypeInvalid;
  ~TensorState() {
    [shape release];
  }
};

struct TensorDataState {
  id<MTLBuffer> buffer = nil;
  MPSShape* shape = nil;
  MPSDataType data_type = MPSDataTypeInvalid;
  ~TensorDataState() {
    [buffer release];
    [shape release];
  }
};

struct CompilationDescriptorState {
  MPSGraphOptimization level = MPSGraphOptimizationLevel1;
};

struct ExecutionDescriptorState {
  bool commit_and_continue = false;
  MPSGraphCompilationDescriptor* compilation = nil;
  ~ExecutionDescriptorState() {
    [compilation release];
  }
};

// A feed or result of the stand-in kernel.
struct Operand {
  sim::BufferPtr buffer;
  MPSDataType data_type;
  size_t elements;
};

std::vector<Operand> operandsOf(MPSGraphTensorDataDictionary* dictionary) {
  std::vector<Operand> operands;
  for (MPSGraphTensorData* data in [dictionary allValues]) {
    const auto& d = state<TensorDataState>(data);
    size_t elements = 1;
    for (NSNumber* n in d.shape) {
      elements *= [n unsignedLongValue];
    }
    operands.push_back({sim::metal::bufferOf(d.buffer), d.data_type, elements});
  }
  return operands;
}

// The element types the stand-in casts between.
template <typename F>
void visitElement(MPSDataType type, F&& f) {
  switch (type) {
    case MPSDataTypeInt32:
      return f(int32_t{});
    case MPSDataTypeInt64:
      return f(int64_t{});
    case MPSDataTypeFloat32:
      return f(float{});
    default:
      std::fprintf(stderr, "simulated MPSGraph: no cast for data type %#x\n", static_cast<unsigned>(type));
      std::abort();
  }
}

void castElements(const Operand& in, const Operand& out) {
  const size_t n = std::min(in.elements, out.elements);
  visitElement(in.data_type, [&](auto from) {
    visitElement(out.data_type, [&](auto to) {
      const auto* src = reinterpret_cast<const decltype(from)*>(in.buffer->contents());
      auto* dst = reinterpret_cast<decltype(to)*>(out.buffer->contents());
      std::transform(src, src + n, dst, [](auto v) { return static_cast<decltype(to)>(v); });
    });
  });
}

} // namespace

@implementation MPSGraphObject
@end

@implementation MPSGraphTensor
SIM_OBJC_STATE(TensorState)
SIM_OBJC_RETAIN_COUNT(TensorState)
- (id)copyWithZone:(NSZone*)zone {
  return [self retain];
}
- (MPSShape*)shape {
  return state<TensorState>(self).shape;
}
- (MPSDataType)dataType {
  return state<TensorState>(self).data_type;
}
@end

@implementation MPSGraphTensorData
SIM_OBJC_STATE(TensorDataState)
SIM_OBJC_RETAIN_COUNT(TensorDataState)
- (instancetype)initWithMTLBuffer:(id<MTLBuffer>)buffer shape:(MPSShape*)shape dataType:(MPSDataType)dataType {
  auto& s = state<TensorDataState>(self);
  s.buffer = [buffer retain];
  s.shape = [shape copy];
  s.data_type = dataType;
  return self;
}
- (MPSShape*)shape {
  return state<TensorDataState>(self).shape;
}
- (MPSDataType)dataType {
  return state<TensorDataState>(self).data_type;
}
@end

@implementation MPSGraphCompilationDescriptor
SIM_OBJC_STATE(CompilationDescriptorState)
SIM_OBJC_RETAIN_COUNT(CompilationDescriptorState)
- (id)copyWithZone:(NSZone*)zone {
  MPSGraphCompilationDescriptor* copy = [[MPSGraphCompilationDescriptor allocWithZone:zone] init];
  state<CompilationDescriptorState>(copy) = state<CompilationDescriptorState>(self);
  return copy;
}
- (MPSGraphOptimization)optimizationLevel {
  return state<CompilationDescriptorState>(self).level;
}
- (void)setOptimizationLevel:(MPSGraphOptimization)level {
  state<CompilationDescriptorState>(self).level = level;
}
@end

// MPSStream.mm declares enableCommitAndContinue in a class extension.
@interface MPSGraphExecutionDescriptor ()
@property(readwrite, atomic) BOOL enableCommitAndContinue;
@end

@implementation MPSGraphExecutionDescriptor
SIM_OBJC_STATE(ExecutionDescriptorState)
SIM_OBJC_RETAIN_COUNT(ExecutionDescriptorState)
- (BOOL)enableCommitAndContinue {
  return state<ExecutionDescriptorState>(self).commit_and_continue;
}
- (void)setEnableCommitAndContinue:(BOOL)enable {
  state<ExecutionDescriptorState>(self).commit_and_continue = enable;
}
- (MPSGraphCompilationDescriptor*)compilationDescriptor {
  return state<ExecutionDescriptorState>(self).compilation;
}
- (void)setCompilationDescriptor:(MPSGraphCompilationDescriptor*)descriptor {
  auto& s = state<ExecutionDescriptorState>(self);
  MPSGraphCompilationDescriptor* copy = [descriptor copy];
  [s.compilation release];
  s.compilation = copy;
}
@end

@implementation MPSGraph
SIM_OBJC_STATE(GraphState)
SIM_OBJC_RETAIN_COUNT(GraphState)
- (MPSGraphTensor*)placeholderWithShape:(MPSShape*)shape dataType:(MPSDataType)dataType name:(NSString*)name {
  MPSGraphTensor* tensor = [MPSGraphTensor alloc];
  state<TensorState>(tensor).shape = [shape copy];
  state<TensorState>(tensor).data_type = dataType;
  state<GraphState>(self).tensors.push_back(tensor);
  return tensor;
}
// The result's data type is all the stand-in kernel needs of a cast.
- (MPSGraphTensor*)castTensor:(MPSGraphTensor*)tensor toType:(MPSDataType)type name:(NSString*)name {
  return [self placeholderWithShape:state<TensorState>(tensor).shape dataType:type name:name];
}
- (void)encodeToCommandBuffer:(MPSCommandBuffer*)commandBuffer
                        feeds:(MPSGraphTensorDataDictionary*)feeds
             targetOperations:(NSArray<MPSGraphOperation*>*)targetOperations
            resultsDictionary:(MPSGraphTensorDataDictionary*)resultsDictionary
          executionDescriptor:(MPSGraphExecutionDescriptor*)executionDescriptor {
  std::atomic<int>& encoders = state<GraphState>(self).encoders;
  if (encoders.fetch_add(1) != 0) {
    std::fprintf(stderr, "simulated MPSGraph: two threads encode one MPSGraph at once\n");
    std::abort();
  }
  std::this_thread::sleep_for(kGraphEncodeTime);
  const std::vector<Operand> inputs = operandsOf(feeds);
  const std::vector<Operand> outputs = operandsOf(resultsDictionary);
  sim::Kernel kernel;
  for (const auto& in : inputs) {
    kernel.uses.emplace_back(in.buffer, sim::Access::kRead);
  }
  for (const auto& out : outputs) {
    kernel.uses.emplace_back(out.buffer, sim::Access::kWrite);
  }
  kernel.body = [inputs, outputs] {
    if (inputs.empty()) {
      return;
    }
    const Operand& in = inputs[0];
    for (const auto& out : outputs) {
      if (out.data_type == in.data_type) {
        std::memmove(out.buffer->contents(), in.buffer->contents(), std::min(out.buffer->bytes(), in.buffer->bytes()));
      } else {
        castElements(in, out);
      }
    }
  };
  sim::CommandBufferPtr buffer = sim::metal::commandBufferOf(commandBuffer);
  sim::EncoderPtr encoder = buffer->computeEncoder();
  encoder->dispatch(std::move(kernel));
  encoder->endEncoding();
  if (executionDescriptor.enableCommitAndContinue) {
    [commandBuffer commitAndContinue];
  }
  encoders.fetch_sub(1);
}
@end

// For the link only: Placeholder wraps a strided view in an MPSNDArray
// (macOS 15's strided API), and the glue tests bind contiguous tensors, so no
// method of these classes is implemented and any call fails as an
// unrecognised selector. MPSNDArrayIdentity brings its superclasses.
#define SIM_LINK_ONLY_CLASS(name)  \
  @implementation name             \
  SIM_OBJC_STATE(Stateless)        \
  SIM_OBJC_RETAIN_COUNT(Stateless) \
  @end
SIM_LINK_ONLY_CLASS(MPSNDArrayDescriptor)
SIM_LINK_ONLY_CLASS(MPSNDArray)
SIM_LINK_ONLY_CLASS(MPSKernel)
SIM_LINK_ONLY_CLASS(MPSNDArrayMultiaryBase)
SIM_LINK_ONLY_CLASS(MPSNDArrayMultiaryKernel)
SIM_LINK_ONLY_CLASS(MPSNDArrayUnaryKernel)
SIM_LINK_ONLY_CLASS(MPSNDArrayIdentity)
#undef SIM_LINK_ONLY_CLASS
