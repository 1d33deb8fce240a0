#pragma once

// Harness stand-in for c10::CachingAllocator::format_size, the one name of
// <c10/core/Allocator.h> the portable MPS files use. Same output as c10's:
// up to 1024 the exact count in bytes, else two decimals in the largest of
// KiB, MiB, GiB that the size exceeds (capped at GiB).

#include <cstdint>
#include <cstdio>
#include <string>

namespace c10::CachingAllocator {

inline std::string format_size(uint64_t size) {
  if (size <= 1024) {
    return std::to_string(size) + " bytes";
  }
  const char* unit = "KiB";
  double scaled = static_cast<double>(size) / 1024.0;
  if (size > (uint64_t{1} << 20)) {
    unit = "MiB";
    scaled /= 1024.0;
  }
  if (size > (uint64_t{1} << 30)) {
    unit = "GiB";
    scaled /= 1024.0;
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f %s", scaled, unit);
  return text;
}

} // namespace c10::CachingAllocator
