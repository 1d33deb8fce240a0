#include "hot_paths.h"

#include <benchmark/benchmark.h>

namespace bench {

namespace {
// Leaked like the production pool.
at::mps::StreamPool<Stream>* const process_pool =
    new at::mps::StreamPool<Stream>(
        std::make_unique<Backend>(),
        at::mps::StreamPoolOptions{});
Stream* legacy_stream = nullptr;
} // namespace

Stream* legacyGetCurrentStream() {
  if (legacy_stream == nullptr) {
    legacy_stream = new Stream{0};
  }
  return legacy_stream;
}

Stream* poolGetCurrentStream() {
  return &process_pool->currentStream();
}

void untrackedAccess(void* buffer) {
  benchmark::DoNotOptimize(buffer);
}

void trackedAccess(
    at::mps::DependencyTracker& tracker,
    at::mps::BufferUseTable& table,
    at::mps::DependencyStream& stream,
    void* buffer,
    at::mps::Access access) {
  tracker.useInPass(stream, table, buffer, access);
}

} // namespace bench
