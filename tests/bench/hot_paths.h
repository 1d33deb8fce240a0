// The single-thread hot paths that bench_hot_paths times, each out of line
// as in PyTorch, next to the v2.9.1 code it replaces. hot_paths.cpp is built
// twice (tests/bench/CMakeLists.txt): linked into the program, where a
// thread_local read is a direct TLS load, and into a shared library with the
// portable core, where it takes the dynamic TLS path, as in libtorch.

#pragma once

#include <ATen/mps/MPSStreamDependencies.h>
#include <ATen/mps/MPSStreamPool.h>

#include <memory>

namespace bench {

struct Stream {
  int index;
};

class Backend : public at::mps::StreamBackend<Stream> {
 public:
  std::unique_ptr<Stream> create(at::mps::StreamIndex i) override {
    return std::make_unique<Stream>(Stream{i});
  }
  void synchronize(Stream&) override {}
  void onLeaseReleased(Stream&) override {}
};

// v2.9.1: MPSStreamImpl::getInstance() behind getCurrentMPSStream().
Stream* legacyGetCurrentStream();
// The pool-backed getCurrentMPSStream() of a process pool (the main thread
// gets the default stream).
Stream* poolGetCurrentStream();

// What getMTLBufferStorage() adds per buffer: nothing in v2.9.1; with the
// patch, trackMPSBufferUseInPass(), which records the use with the access
// its caller passes at run time.
void untrackedAccess(void* buffer);
void trackedAccess(
    at::mps::DependencyTracker& tracker,
    at::mps::BufferUseTable& table,
    at::mps::DependencyStream& stream,
    void* buffer,
    at::mps::Access access);

} // namespace bench
