#pragma once

// StreamEvent's private state, for the tests.

#include <ATen/mps/MPSEventCore.h>

#include <cstdint>

namespace at::mps {

struct StreamEventTestPeer {
  template <typename Backend>
  static uint64_t id(const StreamEvent<Backend>& event) {
    return event.id_;
  }
};

} // namespace at::mps
