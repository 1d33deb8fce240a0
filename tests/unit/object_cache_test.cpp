// The graph/kernel cache policy: one shared object per key, created once, and
// a per-entry encode lock so that no cached object is encoded by two threads
// at the same time, while different objects encode in parallel.

#include "harness.h"

#include <ATen/mps/MPSObjectCache.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using harness::getWithin;

using at::mps::EncodeGuard;
using at::mps::ObjectCache;
using namespace std::chrono_literals;

// Stands in for an MPSKernel or MPSGraph. Apple forbids encoding one MPSKernel
// from two threads at once (METAL-SEMANTICS.md section 6); like the driver,
// the object reports a second concurrent encoder to the simulated device,
// which fails the test at teardown.
class FakeMpsObject {
 public:
  FakeMpsObject(sim::Device& device, std::string name)
      : device_(device), name_(std::move(name)) {}

  void encode() {
    if (encoders_.fetch_add(1) != 0) {
      device_.violation(
          "MPS object '" + name_ + "' encoded by two threads at once");
    }
    ++encodes_; // unsynchronised on purpose: TSan reports an unguarded encode
    std::this_thread::yield();
    encoders_.fetch_sub(1);
  }
  int encodes() const {
    return encodes_;
  }

 private:
  sim::Device& device_;
  const std::string name_;
  std::atomic<int> encoders_{0};
  int encodes_ = 0;
};

// The cached value, as MPSGraphCache's entry holds its graph.
using Entry = std::unique_ptr<FakeMpsObject>;

const void* identityOf(const Entry& e) {
  return e.get();
}

using Cache = ObjectCache<Entry>;

class ObjectCacheTest : public harness::SimTest {
 protected:
  std::unique_ptr<FakeMpsObject> make(const std::string& name) {
    return std::make_unique<FakeMpsObject>(device(), name);
  }
  Cache cache_{&identityOf};
};

TEST_F(ObjectCacheTest, ConcurrentRequestsOfOneKeyShareOneObjectCreatedOnce) {
  constexpr int kThreads = 12;
  std::atomic<int> creates{0};
  std::vector<const Entry*> seen(kThreads);
  harness::Latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arriveAndWait();
      seen[t] = &cache_.getOrCreate("mps_linear:f32", [&] {
        creates.fetch_add(1);
        std::this_thread::sleep_for(10ms);
        return make("linear");
      });
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_EQ(creates.load(), 1);
  for (const Entry* e : seen) {
    EXPECT_EQ(e, seen[0]);
  }
  EXPECT_EQ(cache_.find("mps_linear:f32"), seen[0]);
}

// Lookup by object identity is observed through encodeGuard() below.
TEST_F(ObjectCacheTest, FindsEntriesByKey) {
  const Entry& a = cache_.getOrCreate("a", [&] { return make("a"); });
  const Entry& b = cache_.getOrCreate("b", [&] { return make("b"); });
  EXPECT_EQ(cache_.find("a"), &a);
  EXPECT_EQ(cache_.find("b"), &b);
  EXPECT_EQ(cache_.find("c"), nullptr);
}

TEST_F(ObjectCacheTest, NullObjectFromCreateIsAnErrorAndNotCached) {
  EXPECT_TORCH_ERROR(
      cache_.getOrCreate(
          "k", []() { return std::unique_ptr<FakeMpsObject>(); }),
      "creating the object for key 'k' returned null");
  EXPECT_EQ(cache_.find("k"), nullptr);
}

// The test that fails if two threads ever hold one entry for encoding at
// once: every thread encodes the same two cached objects under their guards.
TEST_F(ObjectCacheTest, NoObjectIsEverEncodedByTwoThreadsAtOnce) {
  constexpr int kThreads = 8;
  const int kIterations = 2000 * harness::stressScale();
  harness::Latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arriveAndWait();
      for (int i = 0; i < kIterations; ++i) {
        const std::string key = (i + t) % 2 == 0 ? "graph:even" : "graph:odd";
        FakeMpsObject* object =
            cache_.getOrCreate(key, [&] { return make(key); }).get();
        // Encoders hold only the raw object, as runMPSGraph does.
        EncodeGuard guard = cache_.encodeGuard(object);
        object->encode();
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_EQ(
      (*cache_.find("graph:even"))->encodes() +
          (*cache_.find("graph:odd"))->encodes(),
      kThreads * kIterations);
}

TEST_F(ObjectCacheTest, SecondEncoderOfOneObjectWaitsForTheFirst) {
  FakeMpsObject* object =
      cache_.getOrCreate("k", [&] { return make("k"); }).get();
  std::promise<void> holding, release;
  auto first = std::async(std::launch::async, [&] {
    EncodeGuard guard = cache_.encodeGuard(object);
    holding.set_value();
    release.get_future().wait();
  });
  holding.get_future().wait();
  std::atomic<bool> entered{false};
  auto second = std::async(std::launch::async, [&] {
    EncodeGuard guard = cache_.encodeGuard(object);
    entered = true;
  });
  EXPECT_EQ(second.wait_for(50ms), std::future_status::timeout);
  EXPECT_FALSE(entered);
  release.set_value();
  getWithin(first);
  getWithin(second);
  EXPECT_TRUE(entered);
}

TEST_F(ObjectCacheTest, DifferentObjectsEncodeInParallel) {
  FakeMpsObject* a = cache_.getOrCreate("a", [&] { return make("a"); }).get();
  FakeMpsObject* b = cache_.getOrCreate("b", [&] { return make("b"); }).get();
  // Each thread waits, inside its guard, for the other to be inside its own:
  // a shared lock would never let both in.
  harness::Latch both_inside(2);
  auto in_a = std::async(std::launch::async, [&] {
    EncodeGuard guard = cache_.encodeGuard(a);
    both_inside.arriveAndWait();
  });
  auto in_b = std::async(std::launch::async, [&] {
    EncodeGuard guard = cache_.encodeGuard(b);
    both_inside.arriveAndWait();
  });
  getWithin(in_a);
  getWithin(in_b);
}

TEST_F(ObjectCacheTest, GuardIsReentrantOnTheHoldingThreadOnly) {
  FakeMpsObject* object =
      cache_.getOrCreate("k", [&] { return make("k"); }).get();
  {
    EncodeGuard outer = cache_.encodeGuard(object);
    EncodeGuard inner = cache_.encodeGuard(object); // would self-deadlock
    object->encode();
  }
  // Fully released: another thread takes it at once.
  auto other = std::async(std::launch::async, [&] {
    EncodeGuard guard = cache_.encodeGuard(object);
    object->encode();
  });
  getWithin(other);
}

TEST_F(ObjectCacheTest, ObjectsNotFromTheCacheGetAGuardThatLocksNothing) {
  FakeMpsObject stranger(device(), "stranger");
  EncodeGuard held = cache_.encodeGuard(&stranger);
  auto other = std::async(std::launch::async, [&] {
    EncodeGuard guard = cache_.encodeGuard(&stranger);
  });
  getWithin(other);
}

TEST_F(ObjectCacheTest, ConcurrentHitsMissesAndEncodesOverManyKeys) {
  constexpr int kKeys = 64;
  constexpr int kThreads = 8;
  const int kIterations = 3000 * harness::stressScale();
  std::vector<std::atomic<int>> creates(kKeys);
  harness::Latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::uniform_int_distribution<int> pick(0, kKeys - 1);
      start.arriveAndWait();
      for (int i = 0; i < kIterations; ++i) {
        const int k = pick(rng);
        const std::string key = "op:" + std::to_string(k);
        const Entry* entry = cache_.find(key);
        if (entry == nullptr) {
          entry = &cache_.getOrCreate(key, [&] {
            creates[k].fetch_add(1);
            return make(key);
          });
        }
        EncodeGuard guard = cache_.encodeGuard(entry->get());
        (*entry)->encode();
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  int total = 0;
  for (int k = 0; k < kKeys; ++k) {
    EXPECT_LE(creates[k].load(), 1);
    if (const Entry* e = cache_.find("op:" + std::to_string(k))) {
      total += (*e)->encodes();
    }
  }
  EXPECT_EQ(total, kThreads * kIterations);
}

} // namespace
