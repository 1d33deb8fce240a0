// The stream pool through its public entry points.

#include <ATen/mps/MPSStream.h>

#include "SimMetalRuntime.h"

#include <gtest/gtest.h>

namespace {

TEST(GlueStream, MainThreadUsesTheDefaultStream) {
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  EXPECT_EQ(stream, at::mps::getDefaultMPSStream());
  EXPECT_EQ(stream->unwrap().id(), 0);
  EXPECT_NE(stream->commandQueue(), nil);
}

} // namespace
