#pragma once

// Forced into the second build of MPSStreamDependencies.cpp that
// stream_dependencies_race_test links: the tracker's fast path calls
// harness::fastPathPublished(i) right after it published the use of buffer i
// of an op, so a test can stop it there and let another stream in.

#include <cstddef>

namespace harness {
void fastPathPublished(size_t buffer_index);
} // namespace harness

#define MPS_DEPENDENCY_FAST_PATH_HOOK(i) ::harness::fastPathPublished(i)
