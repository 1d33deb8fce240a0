#pragma once

// Fixtures for the allocator-core tests: the core on simulated device
// memory, driven either by real simulated streams (AllocatorSimTest) or by a
// hand-driven timeline behind a gmock (FakeTimelines).

#include "SimAllocator.h"
#include "harness.h"

#include <ATen/mps/MPSAllocatorCore.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

namespace at::mps {

// Where the cached bytes are, counted under each container's lock. Slow.
struct AllocatorCensus {
  int64_t stream_cached_bytes = 0; // in per-stream caches
  int64_t free_bytes = 0; // in pools' free sets
  int64_t pending_bytes = 0; // waiting on fences
  int64_t blocks = 0; // blocks in any of those
};

// The core's private state, for the tests.
struct AllocatorCoreTestPeer {
  static AllocatorCensus census(CachingAllocatorCore& core) {
    using Block = CachingAllocatorCore::Block;
    AllocatorCensus c;
    const auto count = [&c](int64_t& bytes, const Block* b) {
      bytes += static_cast<int64_t>(b->size);
      ++c.blocks;
    };
    for (auto& p : core.pools_) {
      {
        MutexLock lock(p->mu);
        for (Block* b : p->free_blocks) {
          count(c.free_bytes, b);
        }
        std::set<Block*> pending;
        for (const auto& fences : p->fences) {
          for (const auto& [value, b] : fences) {
            pending.insert(b);
          }
        }
        for (Block* b : pending) {
          count(c.pending_bytes, b);
        }
      }
      for (auto& cache : p->caches) {
        CacheLockGuard lock(cache.mu);
        for (Block* b : cache.blocks) {
          count(c.stream_cached_bytes, b);
        }
      }
    }
    return c;
  }
};

} // namespace at::mps

namespace harness {

using AllocatorCore = at::mps::CachingAllocatorCore;

inline at::mps::AllocatorCensus census(AllocatorCore& core) {
  return at::mps::AllocatorCoreTestPeer::census(core);
}

// Pools like PyTorch's: hazard-tracked small and large pools, the large one
// reacting to memory pressure, and an untracked scalar pool that the CPU
// writes right after allocation.
enum TestPool { kSmall = 0, kLarge = 1, kScalar = 2 };
constexpr size_t kMaxOversize = 1 << 20;

inline std::vector<at::mps::AllocatorPoolOptions> testPools() {
  std::vector<at::mps::AllocatorPoolOptions> pools(3);
  pools[kSmall].name = "small";
  pools[kLarge].name = "large";
  pools[kLarge].pressure_aware = true;
  pools[kLarge].max_oversize = kMaxOversize;
  pools[kScalar].name = "scalar";
  pools[kScalar].same_stream_reuse = false;
  return pools;
}

// The allocator over real simulated streams. Every handout goes through
// alloc(), which asks the hazard detector whether another queue may still
// touch the buffer; the SimTest teardown fails the test on any hazard.
class AllocatorSimTest : public SimTest {
 protected:
  explicit AllocatorSimTest(sim::Config config = {}) : SimTest(config) {}

  void build(size_t capacity = SIZE_MAX) {
    backend_ = std::make_unique<sim::SimAllocatorBackend>(device(), capacity);
    pool_ = std::make_unique<sim::SimStreamPool>(
        std::make_unique<sim::SimStreamBackend>(device()),
        at::mps::StreamPoolOptions{});
    timelines_ = std::make_unique<sim::SimTimelines>(*pool_);
    core_ =
        std::make_unique<AllocatorCore>(*backend_, *timelines_, testPools());
  }

  // Streams finish their work (running every completion handler) before
  // the core goes; the core then releases what it caches.
  void releaseResources() override {
    timelines_.reset();
    pool_.reset();
    device().waitIdle();
    core_.reset();
    if (backend_) {
      EXPECT_EQ(backend_->live(), 0u) << "device buffers leaked";
      EXPECT_EQ(backend_->used(), 0u);
    }
    backend_.reset();
  }

  sim::SimStream& stream(at::mps::StreamIndex s) {
    return pool_->stream(s);
  }

  // malloc on stream `s`, checked by the hazard detector: the scalar pool
  // hands memory to the CPU, the others to the stream's queue.
  sim::BufferPtr alloc(at::mps::StreamIndex s, size_t size, int pool = kSmall) {
    sim::BufferPtr b = backend_->buffer(core_->malloc(pool, size, s));
    device().hazards().checkHandout(
        *b, pool == kScalar ? nullptr : &stream(s).queue());
    return b;
  }
  void release(const sim::BufferPtr& b) {
    core_->free(b.get());
  }

  static sim::Kernel write(const sim::BufferPtr& b, int64_t v) {
    return {{{b, sim::Access::kWrite}}, [b, v] { b->write(0, v); }};
  }
  static sim::Kernel read(const sim::BufferPtr& b) {
    return {{{b, sim::Access::kRead}}, [b] { (void)b->read(0); }};
  }

  // Everything committed and completed; every requested commit made.
  void quiesce() {
    timelines_->drainCommits();
    pool_->synchronizeAll();
    device().waitIdle();
  }

  std::unique_ptr<sim::SimAllocatorBackend> backend_;
  std::unique_ptr<sim::SimStreamPool> pool_;
  std::unique_ptr<sim::SimTimelines> timelines_;
  std::unique_ptr<AllocatorCore> core_;
};

// A timeline driven by the test: pendingPoint/completedPoint return what the
// test set, onCompleted handlers run when the test completes a value, and
// waitFor completes the value it waits for.
class FakeTimelines {
 public:
  uint64_t pending(at::mps::StreamIndex s) {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_[s];
  }
  uint64_t completed(at::mps::StreamIndex s) {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_[s];
  }
  void setPending(at::mps::StreamIndex s, uint64_t v) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[s] = v;
  }
  void onCompleted(
      at::mps::StreamIndex s,
      uint64_t v,
      std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (completed_[s] < v) {
        handlers_.emplace_back(s, v, std::move(fn));
        return;
      }
    }
    fn();
  }
  // Completes `stream` up to `v` and runs the handlers that covers.
  void complete(at::mps::StreamIndex s, uint64_t v) {
    std::vector<std::function<void()>> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_[s] = std::max(completed_[s], v);
      for (auto it = handlers_.begin(); it != handlers_.end();) {
        if (std::get<0>(*it) == s && std::get<1>(*it) <= completed_[s]) {
          ready.push_back(std::move(std::get<2>(*it)));
          it = handlers_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& fn : ready) {
      fn();
    }
  }
  // Sets only the value completedPoint() reports, running no handler: what
  // a malloc sees before the completion handler has run.
  void completeSilently(at::mps::StreamIndex s, uint64_t v) {
    std::lock_guard<std::mutex> lock(mu_);
    completed_[s] = std::max(completed_[s], v);
  }
  size_t waitingHandlers() {
    std::lock_guard<std::mutex> lock(mu_);
    return handlers_.size();
  }

 private:
  std::mutex mu_;
  std::array<uint64_t, at::mps::kStreamsPerPool> pending_{};
  std::array<uint64_t, at::mps::kStreamsPerPool> completed_{};
  std::vector<std::tuple<at::mps::StreamIndex, uint64_t, std::function<void()>>>
      handlers_;
};

class MockTimelines : public at::mps::StreamTimelines {
 public:
  MOCK_METHOD(uint64_t, pendingPoint, (at::mps::StreamIndex), (override));
  MOCK_METHOD(uint64_t, completedPoint, (at::mps::StreamIndex), (override));
  MOCK_METHOD(void, requestCommit, (at::mps::StreamIndex), (override));
  MOCK_METHOD(
      void,
      onCompleted,
      (at::mps::StreamIndex, uint64_t, std::function<void()>),
      (override));
  MOCK_METHOD(void, waitFor, (at::mps::StreamIndex, uint64_t), (override));

  // Every call goes to `fake` unless a test sets an expectation.
  void delegateTo(FakeTimelines& fake) {
    using ::testing::_;
    using ::testing::Invoke;
    ON_CALL(*this, pendingPoint(_)).WillByDefault(Invoke([&](auto s) {
      return fake.pending(s);
    }));
    ON_CALL(*this, completedPoint(_)).WillByDefault(Invoke([&](auto s) {
      return fake.completed(s);
    }));
    ON_CALL(*this, onCompleted(_, _, _))
        .WillByDefault(Invoke([&](auto s, uint64_t v, auto fn) {
          fake.onCompleted(s, v, std::move(fn));
        }));
    ON_CALL(*this, waitFor(_, _)).WillByDefault(Invoke([&](auto s, uint64_t v) {
      fake.complete(s, v);
    }));
  }
};

// The core on simulated buffers with a hand-driven, mocked timeline.
class AllocatorFakeTest : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    timelines_.delegateTo(fake_);
  }
  void build(size_t capacity = SIZE_MAX) {
    backend_ = std::make_unique<sim::SimAllocatorBackend>(device(), capacity);
    core_ = std::make_unique<AllocatorCore>(*backend_, timelines_, testPools());
  }
  void releaseResources() override {
    core_.reset();
    if (backend_) {
      EXPECT_EQ(backend_->live(), 0u) << "device buffers leaked";
    }
    backend_.reset();
  }
  sim::BufferPtr alloc(at::mps::StreamIndex s, size_t size, int pool = kSmall) {
    return backend_->buffer(core_->malloc(pool, size, s));
  }
  void release(const sim::BufferPtr& b) {
    core_->free(b.get());
  }

  FakeTimelines fake_;
  ::testing::NiceMock<MockTimelines> timelines_;
  std::unique_ptr<sim::SimAllocatorBackend> backend_;
  std::unique_ptr<AllocatorCore> core_;
};

} // namespace harness
