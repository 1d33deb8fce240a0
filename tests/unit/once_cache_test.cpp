// The create-once cache behind the shader-library, pipeline-state, graph and
// kernel caches: one creation per key, no lock held while creating, waiting
// instead of duplicating, retry after failure.

#include "harness.h"

#include <ATen/mps/MPSObjectCache.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using harness::getWithin;

using at::mps::OnceCache;
using namespace std::chrono_literals;

// Stands in for a compiled library or pipeline state: counts live instances
// so a duplicate that was made and dropped would show.
struct Compiled {
  static std::atomic<int> live;
  explicit Compiled(int v) : value(v) {
    live.fetch_add(1);
  }
  ~Compiled() {
    live.fetch_sub(1);
  }
  Compiled(const Compiled&) = delete;
  Compiled& operator=(const Compiled&) = delete;
  int value;
};
std::atomic<int> Compiled::live{0};

using Cache = OnceCache<std::string, std::unique_ptr<Compiled>>;

std::unique_ptr<Compiled> compiled(int v) {
  return std::make_unique<Compiled>(v);
}

TEST(OnceCacheTest, CreatesOnceAndReturnsTheSameValueOnEveryRequest) {
  Cache cache;
  int creates = 0;
  const auto& a = cache.getOrCreate("k", [&] {
    ++creates;
    return compiled(7);
  });
  const auto& b = cache.getOrCreate("k", [&] {
    ++creates;
    return compiled(8);
  });
  EXPECT_EQ(creates, 1);
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(a->value, 7);
  ASSERT_NE(cache.find("k"), nullptr);
  EXPECT_EQ(cache.find("k"), &a);
  EXPECT_EQ(cache.find("other"), nullptr);
}

TEST(OnceCacheTest, ReferencesStayValidWhileTheCacheGrows) {
  OnceCache<int, int> cache;
  const int& first = cache.getOrCreate(0, [] { return 42; });
  for (int i = 1; i < 5000; ++i) {
    cache.getOrCreate(i, [i] { return i; });
  }
  EXPECT_EQ(&first, cache.find(0));
  EXPECT_EQ(first, 42);
}

TEST(OnceCacheTest, ConcurrentMissesOfOneKeyCreateOneValueAndLeakNothing) {
  const int live_before = Compiled::live.load();
  {
    Cache cache;
    constexpr int kThreads = 16;
    std::atomic<int> creates{0};
    std::vector<const Compiled*> seen(kThreads);
    harness::Latch start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arriveAndWait();
        seen[t] = cache
                      .getOrCreate(
                          "pipeline",
                          [&] {
                            creates.fetch_add(1);
                            // Widen the window in which others arrive.
                            std::this_thread::sleep_for(20ms);
                            return compiled(t);
                          })
                      .get();
      });
    }
    for (auto& th : threads) {
      th.join();
    }
    EXPECT_EQ(creates.load(), 1);
    for (const Compiled* c : seen) {
      EXPECT_EQ(c, seen[0]);
    }
    EXPECT_EQ(Compiled::live.load() - live_before, 1);
  }
  EXPECT_EQ(Compiled::live.load(), live_before);
}

TEST(OnceCacheTest, RequesterOfAKeyBeingCreatedWaitsAndOtherKeysProceed) {
  Cache cache;
  std::promise<void> creating, release;
  auto creator = std::async(std::launch::async, [&] {
    return cache
        .getOrCreate(
            "slow",
            [&] {
              creating.set_value();
              release.get_future().wait();
              return compiled(1);
            })
        ->value;
  });
  creating.get_future().wait();

  // No lock is held while "slow" is created: other keys hit and miss.
  auto other = std::async(std::launch::async, [&] {
    return cache.getOrCreate("fast", [] { return compiled(2); })->value;
  });
  EXPECT_EQ(getWithin(other), 2);
  EXPECT_EQ(cache.find("slow"), nullptr); // still being created

  std::atomic<bool> duplicate{false};
  auto waiter = std::async(std::launch::async, [&] {
    return cache
        .getOrCreate(
            "slow",
            [&] {
              duplicate = true;
              return compiled(3);
            })
        ->value;
  });
  EXPECT_EQ(waiter.wait_for(50ms), std::future_status::timeout);
  release.set_value();
  EXPECT_EQ(getWithin(creator), 1);
  EXPECT_EQ(getWithin(waiter), 1);
  EXPECT_FALSE(duplicate);
}

TEST(OnceCacheTest, FailedCreationIsNotStoredAndTheNextRequestRetries) {
  Cache cache;
  EXPECT_TORCH_ERROR(
      cache.getOrCreate(
          "k",
          []() -> std::unique_ptr<Compiled> {
            TORCH_CHECK(false, "compile error: bad shader");
          }),
      "compile error: bad shader");
  EXPECT_EQ(cache.find("k"), nullptr);
  EXPECT_EQ(cache.getOrCreate("k", [] { return compiled(5); })->value, 5);
}

TEST(OnceCacheTest, WaiterCreatesTheValueWhenTheCreatorFails) {
  Cache cache;
  std::promise<void> creating, release;
  auto creator = std::async(std::launch::async, [&] {
    cache.getOrCreate("k", [&]() -> std::unique_ptr<Compiled> {
      creating.set_value();
      release.get_future().wait();
      throw std::runtime_error("device lost");
    });
  });
  creating.get_future().wait();
  std::atomic<bool> waiter_created{false};
  auto waiter = std::async(std::launch::async, [&] {
    return cache
        .getOrCreate(
            "k",
            [&] {
              waiter_created = true;
              return compiled(9);
            })
        ->value;
  });
  EXPECT_EQ(waiter.wait_for(50ms), std::future_status::timeout);
  release.set_value();
  EXPECT_THROW(getWithin(creator), std::runtime_error);
  EXPECT_EQ(getWithin(waiter), 9);
  EXPECT_TRUE(waiter_created);
}

TEST(OnceCacheTest, RequestingTheKeyBeingCreatedFromItsOwnCreationIsAnError) {
  OnceCache<int, int> cache;
  const int& v = cache.getOrCreate(1, [&] {
    EXPECT_TORCH_ERROR(cache.getOrCreate(1, [] { return 0; }), "recursive");
    // Creating a different key from inside a creation is fine.
    return cache.getOrCreate(2, [] { return 20; }) + 1;
  });
  EXPECT_EQ(v, 21);
  EXPECT_EQ(*cache.find(2), 20);
}

TEST(OnceCacheTest, ForEachVisitsCreatedValuesOnly) {
  OnceCache<int, int> cache;
  for (int i = 0; i < 40; ++i) {
    cache.getOrCreate(i, [i] { return i * i; });
  }
  std::promise<void> creating, release;
  auto pending = std::async(std::launch::async, [&] {
    cache.getOrCreate(1000, [&] {
      creating.set_value();
      release.get_future().wait();
      return -1;
    });
  });
  creating.get_future().wait();
  std::map<int, int> seen;
  cache.forEach([&](const auto& kv) { seen[kv.first] = kv.second; });
  release.set_value();
  getWithin(pending);
  ASSERT_EQ(seen.size(), 40u);
  for (const auto& [k, v] : seen) {
    EXPECT_EQ(v, k * k);
  }
}

TEST(OnceCacheTest, ConcurrentHitsAndMissesOverManyKeysCreateEachKeyOnce) {
  OnceCache<int, int> cache;
  constexpr int kKeys = 300;
  constexpr int kThreads = 8;
  const int kRequests = 3000 * harness::stressScale();
  std::vector<std::atomic<int>> creates(kKeys);
  harness::Latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::uniform_int_distribution<int> key(0, kKeys - 1);
      start.arriveAndWait();
      for (int i = 0; i < kRequests; ++i) {
        const int k = key(rng);
        const int v = cache.getOrCreate(k, [&] {
          creates[k].fetch_add(1);
          return k + 1;
        });
        ASSERT_EQ(v, k + 1);
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  for (int k = 0; k < kKeys; ++k) {
    EXPECT_LE(creates[k].load(), 1) << "key " << k;
  }
}

} // namespace
