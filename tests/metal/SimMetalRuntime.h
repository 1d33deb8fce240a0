#pragma once

// The simulated Metal, MetalPerformanceShaders and MetalPerformanceShadersGraph
// frameworks on Linux: Objective-C classes with the names and protocols of
// the SDK stand-ins (tests/compile/sdk), each a thin face on the C++
// simulator (tests/sim/SimMetal.h). Same queues, latencies, in-flight cap,
// completion thread, shared events, faults and hazard detector: a command
// queue is a sim::Queue, an MPSCommandBuffer a sim::CommandBuffer, an
// encoder pass a sim::ComputeEncoder pass, an MTLBuffer a sim::Buffer (its
// retainCount counts the command buffers still holding it, as Metal's
// retained references do), an MTLSharedEvent a sim::SharedEvent.
//
// This header is what the tests see of it: the configuration, the simulator
// behind the Objective-C objects, and the kernels that ops would encode.

#include "SimMetal.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#ifdef __OBJC__
#include <Metal/Metal.h>
#endif

namespace sim::metal {

struct RuntimeConfig {
  Config gpu;
  // MTLDevice.recommendedMaxWorkingSetSize
  uint64_t working_set_bytes = uint64_t{8} << 30;
  // newHeapWithDescriptor: returns nil once the heaps would exceed this.
  uint64_t memory_bytes = uint64_t{16} << 30;
};

// Must run before the first MTLCreateSystemDefaultDevice(); the device lives
// for the rest of the process.
void configure(const RuntimeConfig& config);
Device& device();

#ifdef __OBJC__
BufferPtr bufferOf(id<MTLBuffer> buffer);
Queue& queueOf(id<MTLCommandQueue> queue);
CommandBufferPtr commandBufferOf(id<MTLCommandBuffer> commandBuffer);

// What an op's setBuffer:offset:atIndex: calls and one dispatch do: `body`
// runs on the simulated GPU, and every bound buffer counts as written.
void dispatchKernel(
    id<MTLComputeCommandEncoder> encoder,
    const std::vector<id<MTLBuffer>>& buffers,
    std::function<void()> body);
// The bundled shader library's text: libtorch_cpu's metallib section
// (tests/glue/standins/Darwin.mm), which newLibraryWithData: compiles as
// newLibraryWithSource: does. None until this is called. PyTorch loads the
// bundled library once per process, so the text a process's first load
// sees is the one it keeps: each glue test sets its own, in a process of
// its own (tests/glue/CMakeLists.txt).
void setBundledShaderSource(const std::string& source);
std::string bytesOf(dispatch_data_t data);
// What an MPS kernel's encodeToCommandEncoder: does: one dispatch in the
// encoder's pass, using its buffers as `kernel` says.
void dispatchKernel(id<MTLComputeCommandEncoder> encoder, Kernel kernel);
#endif

// The shader compiler. newLibraryWithSource: takes a while (so that threads
// asking for one library at once overlap), declares a function for each
// `kernel void NAME(` of the source, and fails with
// MTLLibraryErrorCompileFailure and MESSAGE for a source with a line
// `#error MESSAGE`. A dispatch with the pipeline state of function NAME runs
// the body defined for NAME, with the buffers bound in index order and then
// those made resident with useResource:usage:; the hazard detector counts a
// bound buffer as read if NAME declares its argument `constant` or
// `const device`, else as written, and a resident one as its usage says.
using KernelBody = std::function<void(const std::vector<BufferPtr>& buffers)>;
void defineKernel(const std::string& function, KernelBody body);
// Calls of newLibraryWithSource: and newComputePipelineStateWithFunction:
// so far in this process.
struct CompilerCounts {
  int libraries;
  int pipelines;
};
CompilerCounts compilerCounts();
// Calls of encodeWaitForEvent:value: and notifyListener:atValue:block: so far
// in this process: the GPU and CPU waits on shared events.
int64_t eventWaits();

} // namespace sim::metal
