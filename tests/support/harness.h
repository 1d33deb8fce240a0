#pragma once

// Shared fixtures and helpers for the harness tests.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "SimMetal.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace harness {

// Every error path is checked the same way: the exception type a PyTorch
// user sees and a fragment of its message.
#define EXPECT_TORCH_ERROR(statement, fragment) \
  EXPECT_THAT(                                  \
      [&]() { statement; },                     \
      ::testing::ThrowsMessage<::c10::Error>(::testing::HasSubstr(fragment)))

// Multiplies stress iteration counts; 1 on CI, larger on the 16-core runs.
inline int stressScale() {
  const char* v = std::getenv("MPS_STRESS_SCALE");
  const int scale = v ? std::atoi(v) : 1;
  return scale > 0 ? scale : 1;
}

// Sets (or unsets, with nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
    }
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Fails the test (instead of hanging it) if `f` is not ready within `limit`.
template <typename T>
T getWithin(
    std::future<T>& f,
    std::chrono::seconds limit = std::chrono::seconds(10)) {
  if (f.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "timed out";
    std::abort();
  }
  return f.get();
}

// A one-shot countdown latch (std::latch is C++20).
class Latch {
 public:
  explicit Latch(int count) : count_(count) {}
  void countDown() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--count_ <= 0) {
      cv_.notify_all();
    }
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return count_ <= 0; });
  }
  void arriveAndWait() {
    countDown();
    wait();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};

// Owns a simulated device. Contract violations are recorded instead of
// aborting; TearDown fails the test on any violation or hazard that the test
// did not consume with takeViolations() / hazards().clear(), and the device's
// own teardown reports command buffers left in flight.
class SimTest : public ::testing::Test {
 protected:
  explicit SimTest(sim::Config config = {}) : config_(config) {}

  void SetUp() override {
    device_ = std::make_unique<sim::Device>(config_);
    device_->setViolationHandler([this](const std::string& what) {
      std::lock_guard<std::mutex> lock(violations_mu_);
      violations_.push_back(what);
    });
  }

  void TearDown() override {
    releaseResources();
    device_->waitIdle();
    EXPECT_THAT(device_->hazards().reports(), ::testing::IsEmpty());
    device_.reset();
    EXPECT_THAT(takeViolations(), ::testing::IsEmpty());
  }

  // Drop queues, streams and pools here so they go before the device.
  virtual void releaseResources() {}

  sim::Device& device() {
    return *device_;
  }

  std::vector<std::string> takeViolations() {
    std::lock_guard<std::mutex> lock(violations_mu_);
    return std::exchange(violations_, {});
  }

  sim::Config config_;
  std::unique_ptr<sim::Device> device_;
  std::mutex violations_mu_;
  std::vector<std::string> violations_;
};

} // namespace harness
