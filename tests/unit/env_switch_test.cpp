// Strict parsing of the MPS on/off environment variables.

#include "harness.h"

#include <ATen/mps/MPSStreamPool.h>

namespace {

using at::mps::EnvSwitch;
using at::mps::parseEnvSwitch;
using at::mps::readEnvSwitch;

constexpr EnvSwitch kSwitch{
    "MPS_TEST_SWITCH",
    "turn it on",
    "turn it off",
    "the default"};

TEST(EnvSwitchTest, UnsetAndEmptyMeanDefault) {
  EXPECT_EQ(parseEnvSwitch(kSwitch, nullptr), std::nullopt);
  EXPECT_EQ(parseEnvSwitch(kSwitch, ""), std::nullopt);
}

TEST(EnvSwitchTest, AcceptsExactlyZeroAndOne) {
  EXPECT_EQ(parseEnvSwitch(kSwitch, "1"), std::optional<bool>(true));
  EXPECT_EQ(parseEnvSwitch(kSwitch, "0"), std::optional<bool>(false));
}

TEST(EnvSwitchTest, RejectsEverythingElseNamingTheVariable) {
  for (const char* bad : {" 1", "1 ", "01", "true", "yes", "on", "2", "-1"}) {
    SCOPED_TRACE(bad);
    EXPECT_TORCH_ERROR(
        parseEnvSwitch(kSwitch, bad),
        std::string("MPS_TEST_SWITCH='") + bad + "' is not valid");
  }
  EXPECT_TORCH_ERROR(
      parseEnvSwitch(kSwitch, "true"),
      "Accepted values: 1 (turn it on), 0 (turn it off), or unset (the "
      "default).");
}

TEST(EnvSwitchTest, ReadsTheCurrentEnvironment) {
  {
    harness::ScopedEnv env("MPS_TEST_SWITCH", "1");
    EXPECT_EQ(readEnvSwitch(kSwitch), std::optional<bool>(true));
  }
  {
    harness::ScopedEnv env("MPS_TEST_SWITCH", nullptr);
    EXPECT_EQ(readEnvSwitch(kSwitch), std::nullopt);
  }
  harness::ScopedEnv env("MPS_TEST_SWITCH", "off");
  EXPECT_TORCH_ERROR(readEnvSwitch(kSwitch), "MPS_TEST_SWITCH='off'");
}

} // namespace
