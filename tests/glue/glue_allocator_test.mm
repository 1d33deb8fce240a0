// The MPS caching allocator (MPSAllocator.mm on its portable core) from many
// threads: cross-stream frees, record_stream, emptyCache under load. Every
// allocation goes through the fixture's handout check (glue::allocated).

#include "GlueTest.h"

#include <ATen/detail/MPSHooksInterface.h>
#include <ATen/mps/MPSAllocatorInterface.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <set>

namespace {

using glue::GlueTest;

const c10::impl::DeviceGuardImplInterface* guard() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::MPS);
}

size_t sizeFor(int t, int i) {
  static const size_t sizes[] = {64, 256, 4096, 100000, 1 << 20, 3 << 20};
  return sizes[(t + i) % 6];
}

// A buffer freed on its own stream is handed out again on that stream at
// once (v2.9.1's rule, per stream), without waiting for the GPU.
TEST_F(GlueTest, AFreedBlockIsReusedOnItsOwnStreamAtOnce) {
  c10::DataPtr first = glue::allocated(4096);
  id<MTLBuffer> buffer = glue::bufferOf(first);
  glue::encodeKernel({buffer}, [] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  first.clear();
  c10::DataPtr second = glue::allocated(4096);
  EXPECT_EQ(glue::bufferOf(second), buffer);
}

// Threads allocate on their own streams, write and check their buffers; no
// buffer is ever held by two threads.
TEST_F(GlueTest, AllocationsFromManyThreadsAreDistinctAndKeepTheirContents) {
  constexpr int kThreads = 12;
  constexpr int kIterations = 60;
  std::mutex mu;
  std::set<void*> live;
  std::atomic<int> duplicates{0};
  glue::onThreads(kThreads, [&](int t) {
    for (int i = 0; i < kIterations; ++i) {
      c10::DataPtr data = glue::allocated(sizeFor(t, i));
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!live.insert(data.get()).second) {
          duplicates.fetch_add(1);
        }
      }
      sim::BufferPtr b = sim::metal::bufferOf(glue::bufferOf(data));
      const int64_t stamp = t * 100000 + i;
      glue::encodeKernel({glue::bufferOf(data)}, [b, stamp] { glue::words(*b)[0] = stamp; });
      glue::encodeIncrement(glue::bufferOf(data));
      if (i % 4 == 0) {
        guard()->synchronizeStream(at::mps::getCurrentMPSStream()->unwrap());
        EXPECT_EQ(glue::words(glue::bufferOf(data))[0], stamp + 1);
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        live.erase(data.get());
      }
    }
  });
  EXPECT_EQ(duplicates.load(), 0);
}

// Producers allocate and write on their streams and hand the blocks to
// consumers on other threads, which use them on their own streams
// (record_stream), and free them there: the frees cross streams and
// threads, and no block may come back while any of its uses may run.
TEST_F(GlueTest, CrossThreadFreesWithRecordStream) {
  constexpr int kPairs = 4;
  constexpr int kBlocks = 80;
  struct Channel {
    std::mutex mu;
    std::deque<c10::DataPtr> blocks;
    bool done = false;
  };
  std::vector<Channel> channels(kPairs);
  glue::onThreads(2 * kPairs, [&](int t) {
    Channel& channel = channels[t / 2];
    if (t % 2 == 0) {
      for (int i = 0; i < kBlocks; ++i) {
        c10::DataPtr data = glue::allocated(sizeFor(t, i));
        glue::encodeIncrement(glue::bufferOf(data));
        // The consumer's stream waits for this one before it uses the
        // block (CUDA's contract for a tensor handed between streams).
        c10::Event produced(c10::DeviceType::MPS);
        produced.record(at::mps::getCurrentMPSStream()->unwrap());
        produced.synchronize();
        std::lock_guard<std::mutex> lock(channel.mu);
        channel.blocks.push_back(std::move(data));
      }
      std::lock_guard<std::mutex> lock(channel.mu);
      channel.done = true;
      return;
    }
    for (;;) {
      c10::DataPtr data;
      {
        std::lock_guard<std::mutex> lock(channel.mu);
        if (channel.blocks.empty()) {
          if (channel.done) {
            return;
          }
        } else {
          data = std::move(channel.blocks.front());
          channel.blocks.pop_front();
        }
      }
      if (!data) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      glue::encodeIncrement(glue::bufferOf(data));
      guard()->recordDataPtrOnStream(data, at::mps::getCurrentMPSStream()->unwrap());
      // Freed with the consumer's work still in flight.
    }
  });
}

// Threads allocate, use and free blocks while the main thread empties the
// cache again and again (torch.mps.empty_cache()): nothing in use is
// released, every thread's data stays right.
TEST_F(GlueTest, EmptyCacheUnderLoad) {
  constexpr int kThreads = 8;
  std::atomic<int> finished{0};
  std::thread emptier([&] {
    while (finished.load() < kThreads) {
      at::detail::getMPSHooks().emptyCache();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  glue::onThreads(kThreads, [&](int t) {
    for (int i = 0; i < 40; ++i) {
      c10::DataPtr keep = glue::allocated(sizeFor(t, i));
      c10::DataPtr scratch = glue::allocated(sizeFor(t, i + 1));
      sim::BufferPtr k = sim::metal::bufferOf(glue::bufferOf(keep));
      glue::encodeKernel({glue::bufferOf(keep)}, [k, i] { glue::words(*k)[0] = i; });
      glue::encodeIncrement(glue::bufferOf(scratch));
      scratch.clear();
      glue::encodeIncrement(glue::bufferOf(keep));
      guard()->synchronizeStream(at::mps::getCurrentMPSStream()->unwrap());
      ASSERT_EQ(glue::words(glue::bufferOf(keep))[0], i + 1) << "thread " << t << " iteration " << i;
    }
    finished.fetch_add(1);
  });
  emptier.join();
  at::detail::getMPSHooks().emptyCache();
  EXPECT_EQ(at::detail::getMPSHooks().getCurrentAllocatedMemory(), 0u);
}

// The allocator's statistics through the hooks (torch.mps.*_memory()).
TEST_F(GlueTest, MemoryStatisticsFollowAllocationsAndEmptyCache) {
  const auto& hooks = at::detail::getMPSHooks();
  hooks.emptyCache();
  const size_t before = hooks.getCurrentAllocatedMemory();
  {
    c10::DataPtr data = glue::allocated(1 << 20);
    EXPECT_GE(hooks.getCurrentAllocatedMemory(), before + (1 << 20));
    EXPECT_GE(hooks.getDriverAllocatedMemory(), size_t(1 << 20));
    glue::encodeIncrement(glue::bufferOf(data));
  }
  EXPECT_EQ(hooks.getCurrentAllocatedMemory(), before);
  at::mps::getMPSStreamPool().synchronizeAll();
  hooks.emptyCache();
  EXPECT_EQ(hooks.getDriverAllocatedMemory(), 0u);
  EXPECT_GT(hooks.getRecommendedMaxMemory(), 0u);
}

// The shared (unified-memory) allocator hands out CPU-visible blocks; the
// scalar pool's blocks are written by the CPU at once, so they always wait
// for their fences before reuse.
TEST_F(GlueTest, ScalarBuffersFromManyThreads) {
  glue::onThreads(8, [](int t) {
    for (int i = 0; i < 50; ++i) {
      int64_t value = t * 1000 + i;
      c10::DataPtr scalar = at::mps::getIMPSAllocator()->allocScalarBufferWithValue(&value, sizeof(value));
      id<MTLBuffer> buffer = glue::bufferOf(scalar);
      sim::metal::device().hazards().checkHandout(*sim::metal::bufferOf(buffer), nullptr);
      EXPECT_EQ(glue::words(buffer)[0], value);
      glue::encodeIncrement(buffer);
    }
  });
}

} // namespace
