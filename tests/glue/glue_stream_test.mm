// The stream pool, command buffers, completion handlers, graphs and faults,
// through the entry points PyTorch's ops and Python bindings call.

#include "GlueTest.h"

#include <ATen/detail/MPSHooksInterface.h>
#include <ATen/mps/MPSStream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace {

using at::mps::MPSStream;
using glue::GlueTest;

constexpr int kWorkerStreams = at::mps::kStreamsPerPool - 1;

TEST_F(GlueTest, MainThreadUsesTheDefaultStream) {
  MPSStream* stream = at::mps::getCurrentMPSStream();
  EXPECT_EQ(stream, at::mps::getDefaultMPSStream());
  EXPECT_EQ(stream->unwrap().id(), 0);
  EXPECT_NE(stream->commandQueue(), nil);
  EXPECT_EQ(glue::leasedSlots(), 0);
}

// 32 threads at once: the first 31 lease the 31 worker streams, one each;
// the 32nd shares one (the default exhaustion policy). Every lease comes
// back when its thread exits, so the next 31 threads lease again.
TEST_F(GlueTest, ThirtyTwoThreadsLeaseDistinctStreamsAndReturnThemAtExit) {
  for (int round = 0; round < 2; ++round) {
    std::mutex mu;
    std::vector<MPSStream*> streams;
    std::atomic<int> arrived{0};
    glue::onThreads(kWorkerStreams + 1, [&](int) {
      MPSStream* stream = at::mps::getCurrentMPSStream();
      {
        std::lock_guard<std::mutex> lock(mu);
        streams.push_back(stream);
      }
      // Every thread holds its stream until all have one.
      arrived.fetch_add(1);
      ASSERT_TRUE(glue::eventually([&] { return arrived.load() == kWorkerStreams + 1; }));
      EXPECT_EQ(at::mps::getCurrentMPSStream(), stream);
    });
    std::set<MPSStream*> distinct(streams.begin(), streams.end());
    EXPECT_EQ(distinct.size(), size_t(kWorkerStreams)) << "round " << round;
    EXPECT_EQ(distinct.count(at::mps::getDefaultMPSStream()), 0u);
    EXPECT_EQ(glue::leasedSlots(), 0) << "round " << round;
  }
}

TEST_F(GlueTest, ReleaseCurrentThreadSlotReturnsTheLeaseAndTheNextUseLeasesAgain) {
  std::thread([] {
    MPSStream* first = at::mps::getCurrentMPSStream();
    EXPECT_NE(first, at::mps::getDefaultMPSStream());
    EXPECT_EQ(glue::leasedSlots(), 1);
    glue::encodeIncrement(glue::bufferOf(glue::allocated(64)));
    at::detail::getMPSHooks().releaseCurrentThreadSlot();
    EXPECT_EQ(glue::leasedSlots(), 0);
    EXPECT_NE(at::mps::getCurrentMPSStream(), at::mps::getDefaultMPSStream());
    EXPECT_EQ(glue::leasedSlots(), 1);
  }).join();
  EXPECT_EQ(glue::leasedSlots(), 0);
}

TEST_F(GlueTest, SetCurrentStreamMovesTheThreadsOpsToThatStream) {
  MPSStream* other = at::mps::getMPSStream(5);
  at::mps::getMPSStreamPool().slots().exchangeCurrentIndex(other->index());
  EXPECT_EQ(at::mps::getCurrentMPSStream(), other);
  c10::DataPtr data = glue::allocated(256);
  glue::encodeIncrement(glue::bufferOf(data));
  EXPECT_GT(other->pendingCommitPoint(), 0u);
  other->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  EXPECT_EQ(glue::words(glue::bufferOf(data))[0], 1);
  at::mps::getMPSStreamPool().slots().exchangeCurrentIndex(at::mps::kDefaultStreamIndex);
  EXPECT_EQ(at::mps::getCurrentMPSStream(), at::mps::getDefaultMPSStream());
}

// Each thread's kernels run in order on its own stream, all streams at once.
TEST_F(GlueTest, KernelsFromManyThreadsRunInOrderOnEachStream) {
  constexpr int kThreads = 16;
  constexpr int kKernels = 50;
  glue::onThreads(kThreads, [&](int) {
    c10::DataPtr data = glue::allocated(1024);
    id<MTLBuffer> buffer = glue::bufferOf(data);
    std::memset(sim::metal::bufferOf(buffer)->contents(), 0, 1024);
    for (int k = 0; k < kKernels; ++k) {
      glue::encodeIncrement(buffer);
      if (k % 7 == 0) {
        at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
      }
    }
    at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    for (int i = 0; i < 1024 / 8; ++i) {
      ASSERT_EQ(glue::words(buffer)[i], kKernels) << "word " << i;
    }
  });
}

// A thread adds a completed handler, commits and exits at once: the handler
// still runs, after the work it follows, with its lease already returned.
TEST_F(GlueTest, CompletionHandlersRunAfterTheirThreadExited) {
  constexpr int kThreads = 8;
  std::atomic<int> ran{0};
  std::atomic<int> ran_early{0};
  std::vector<c10::DataPtr> data(kThreads);
  glue::onThreads(kThreads, [&](int i) {
    data[i] = glue::allocated(64);
    id<MTLBuffer> buffer = glue::bufferOf(data[i]);
    glue::encodeIncrement(buffer);
    sim::BufferPtr b = sim::metal::bufferOf(buffer);
    std::atomic<int>* ran_p = &ran;
    std::atomic<int>* early_p = &ran_early;
    at::mps::getCurrentMPSStream()->addCompletedHandler(^(id<MTLCommandBuffer>) {
      if (glue::words(*b)[0] != 1) {
        early_p->fetch_add(1);
      }
      ran_p->fetch_add(1);
    });
    at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
  });
  EXPECT_EQ(glue::leasedSlots(), 0);
  EXPECT_TRUE(glue::eventually([&] { return ran.load() == kThreads; })) << ran.load() << " handlers ran";
  EXPECT_EQ(ran_early.load(), 0);
}

// A handler added when the stream has no uncommitted work waits for the last
// commit (MPSStream::addCompletedHandler's copied-block path).
TEST_F(GlueTest, CompletionHandlerOnAnIdleStreamFollowsTheLastCommit) {
  c10::DataPtr data = glue::allocated(64);
  glue::encodeIncrement(glue::bufferOf(data));
  MPSStream* stream = at::mps::getCurrentMPSStream();
  stream->synchronize(at::mps::SyncType::COMMIT);
  sim::BufferPtr b = sim::metal::bufferOf(glue::bufferOf(data));
  __block int64_t seen = -1;
  std::atomic<bool> ran{false};
  std::atomic<bool>* ran_p = &ran;
  stream->addCompletedHandler(^(id<MTLCommandBuffer> cb) {
    seen = glue::words(*b)[0];
    ran_p->store(true);
  });
  ASSERT_TRUE(glue::eventually([&] { return ran.load(); }));
  EXPECT_EQ(seen, 1);
}

// torch.mps.synchronize() while other threads keep encoding: every kernel
// encoded before the synchronize began has run when it returns.
TEST_F(GlueTest, DeviceSynchronizeWaitsForWorkOtherThreadsEncodedBeforeIt) {
  constexpr int kThreads = 6;
  constexpr int kKernels = 200;
  std::vector<std::unique_ptr<std::atomic<bool>[]>> done(kThreads);
  std::vector<std::atomic<int>> encoded(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    done[t] = std::make_unique<std::atomic<bool>[]>(kKernels);
    encoded[t].store(-1);
  }
  std::atomic<int> finished{0};
  std::thread checker([&] {
    while (finished.load() < kThreads) {
      std::vector<int> before(kThreads);
      for (int t = 0; t < kThreads; ++t) {
        before[t] = encoded[t].load();
      }
      at::detail::getMPSHooks().deviceSynchronize();
      for (int t = 0; t < kThreads; ++t) {
        for (int k = 0; k <= before[t]; ++k) {
          ASSERT_TRUE(done[t][k].load()) << "thread " << t << " kernel " << k;
        }
      }
    }
  });
  glue::onThreads(kThreads, [&](int t) {
    c10::DataPtr data = glue::allocated(64);
    for (int k = 0; k < kKernels; ++k) {
      std::atomic<bool>* flag = &done[t][k];
      glue::encodeKernel({glue::bufferOf(data)}, [flag] { flag->store(true); });
      encoded[t].store(k);
    }
    finished.fetch_add(1);
  });
  checker.join();
  at::mps::getMPSStreamPool().synchronizeAll(); // the kernels write `done`
}

// A command buffer that completes with an error: the next wait on its
// stream raises an error that carries Metal's message, once.
TEST_F(GlueTest, FailedCommandBufferReachesTheUserAsAnError) {
  c10::DataPtr data = glue::allocated(64);
  sim::metal::device().failNextCommits(1, "simulated GPU fault (page fault at 0x1000)");
  glue::encodeIncrement(glue::bufferOf(data));
  const c10::Stream stream = at::mps::getCurrentMPSStream()->unwrap();
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::MPS);
  try {
    guard->synchronizeStream(stream);
    FAIL() << "synchronizeStream returned after a failed command buffer";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("simulated GPU fault (page fault at 0x1000)"), std::string::npos) << e.what();
  }
  guard->synchronizeStream(stream);
  glue::encodeIncrement(glue::bufferOf(data));
  guard->synchronizeStream(stream);
}

// The same from a worker thread's stream, seen by torch.mps.synchronize().
TEST_F(GlueTest, FailureOnAWorkerStreamReachesDeviceSynchronize) {
  std::thread([] {
    c10::DataPtr data = glue::allocated(64);
    sim::metal::device().failNextCommits(1, "simulated GPU fault on a worker");
    glue::encodeIncrement(glue::bufferOf(data));
    try {
      at::detail::getMPSHooks().deviceSynchronize();
      ADD_FAILURE() << "deviceSynchronize returned after a failed command buffer";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("simulated GPU fault on a worker"), std::string::npos) << e.what();
    }
  }).join();
  at::detail::getMPSHooks().deviceSynchronize();
}

// A thread whose stream cannot be created (newCommandQueue returns nil) gets
// an error; the slot stays creatable and the next thread gets its stream.
TEST_F(GlueTest, StreamCreationFailureRaisesAndTheNextThreadSucceeds) {
  sim::metal::device().failNextQueueCreations(1);
  std::thread([] { EXPECT_THROW(at::mps::getCurrentMPSStream(), c10::Error); }).join();
  std::thread([] {
    MPSStream* stream = at::mps::getCurrentMPSStream();
    EXPECT_NE(stream->commandQueue(), nil);
    glue::encodeIncrement(glue::bufferOf(glue::allocated(64)));
  }).join();
}

// MPSGraph execution (the stand-in graph copies its feed into its result)
// from many threads, with commit-and-continue on the default stream.
TEST_F(GlueTest, GraphsRunFromManyThreadsIncludingTheDefaultStream) {
  constexpr int kThreads = 8;
  constexpr int kRuns = 20;
  auto run = [&](int t) {
    @autoreleasepool {
      MPSGraph* graph = [[MPSGraph new] autorelease];
      NSArray<NSNumber*>* shape = [NSArray arrayWithObject:[NSNumber numberWithInt:16]];
      MPSGraphTensor* in = [graph placeholderWithShape:shape dataType:MPSDataTypeInt64 name:nil];
      MPSGraphTensor* out = [graph placeholderWithShape:shape dataType:MPSDataTypeInt64 name:nil];
      c10::DataPtr src = glue::allocated(128);
      c10::DataPtr dst = glue::allocated(128);
      for (int r = 0; r < kRuns; ++r) {
        glue::encodeKernel({glue::bufferOf(src)}, [b = sim::metal::bufferOf(glue::bufferOf(src)), t, r] {
          glue::words(*b)[0] = t * 1000 + r;
        });
        MPSGraphTensorData* in_data = [[[MPSGraphTensorData alloc] initWithMTLBuffer:glue::bufferOf(src)
                                                                               shape:shape
                                                                            dataType:MPSDataTypeInt64] autorelease];
        MPSGraphTensorData* out_data = [[[MPSGraphTensorData alloc] initWithMTLBuffer:glue::bufferOf(dst)
                                                                                shape:shape
                                                                             dataType:MPSDataTypeInt64] autorelease];
        at::mps::noteMPSGraphUse((__bridge const void*)in_data, (__bridge const void*)glue::bufferOf(src));
        at::mps::noteMPSGraphUse((__bridge const void*)out_data, (__bridge const void*)glue::bufferOf(dst));
        at::mps::getCurrentMPSStream()->executeMPSGraph(
            graph,
            [NSDictionary dictionaryWithObject:in_data forKey:in],
            [NSDictionary dictionaryWithObject:out_data forKey:out],
            r % 5 == 4 ? at::mps::SyncType::COMMIT_AND_WAIT : at::mps::SyncType::NONE);
        if (r % 5 == 4) {
          EXPECT_EQ(glue::words(glue::bufferOf(dst))[0], t * 1000 + r);
        }
      }
    }
  };
  std::thread main_thread_peer([&] { run(kThreads); });
  glue::onThreads(kThreads, run);
  main_thread_peer.join();
  run(kThreads + 1); // the default stream, commit-and-continue on
}

// A buffer written on one thread's stream and then read on another's is
// ordered by the dependency tracker, with no event from the user.
TEST_F(GlueTest, CrossStreamUseIsOrderedWithoutEvents) {
  constexpr int kRounds = 30;
  c10::DataPtr shared = glue::allocated(512);
  std::vector<c10::DataPtr> copies(kRounds);
  std::thread producer_consumer([&] {
    for (int r = 0; r < kRounds; ++r) {
      std::thread([&, r] {
        sim::BufferPtr b = sim::metal::bufferOf(glue::bufferOf(shared));
        glue::encodeKernel({glue::bufferOf(shared)}, [b, r] {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          glue::words(*b)[0] = r;
        });
        at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
        std::thread([&, r] {
          copies[r] = glue::allocated(512);
          glue::encodeCopy(glue::bufferOf(shared), glue::bufferOf(copies[r]));
          at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
          EXPECT_EQ(glue::words(glue::bufferOf(copies[r]))[0], r);
        }).join();
      }).join();
    }
  });
  producer_consumer.join();
}

// PyTorch's recipe for custom Metal kernels takes the current stream's
// command buffer (torch::mps::get_command_buffer()) and serial queue
// (get_dispatch_queue()), then opens its own compute encoder on that buffer
// in dispatch_sync on the queue, and commits (torch::mps::commit()). Between
// the two the queue is free: a reader on another stream that needs the
// stream's earlier, uncommitted work commits it there (flushAsync). The
// buffer the recipe holds must still take its encoder.
TEST_F(GlueTest, ExtensionCommandBufferStaysOpenWhenAnotherStreamCommitsEarlierWork) {
  std::thread([] {
    @autoreleasepool {
      const auto& hooks = at::detail::getMPSHooks();
      c10::DataPtr produced = glue::allocated(64);
      c10::DataPtr result = glue::allocated(64);
      glue::encodeIncrement(glue::bufferOf(produced));
      id<MTLCommandBuffer> buffer = (__bridge id<MTLCommandBuffer>)hooks.getCommandBuffer();
      dispatch_queue_t queue = (__bridge dispatch_queue_t)hooks.getDispatchQueue();
      std::thread([&] {
        c10::DataPtr copy = glue::allocated(64);
        glue::encodeCopy(glue::bufferOf(produced), glue::bufferOf(copy));
        at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
        EXPECT_EQ(glue::words(glue::bufferOf(copy))[0], 1);
      }).join();
      id<MTLBuffer> out = glue::bufferOf(result);
      sim::BufferPtr simulated = sim::metal::bufferOf(out);
      dispatch_sync(queue, ^() {
        id<MTLComputeCommandEncoder> encoder = [buffer computeCommandEncoder];
        sim::metal::dispatchKernel(encoder, {out}, [simulated] { glue::words(*simulated)[0] = 7; });
        [encoder endEncoding];
        hooks.commitStream();
      });
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_EQ(glue::words(out)[0], 7);
    }
  }).join();
}

// An extension may run its block with dispatch_async on get_dispatch_queue():
// the block runs on a libdispatch thread, yet takes the command buffer of the
// queue's stream and commits that stream, leasing no stream of its own.
TEST_F(GlueTest, ExtensionAsyncBlockEncodesAndCommitsOnTheQueuesStream) {
  std::thread([] {
    @autoreleasepool {
      const auto& hooks = at::detail::getMPSHooks();
      MPSStream* stream = at::mps::getCurrentMPSStream();
      c10::DataPtr result = glue::allocated(64);
      id<MTLBuffer> out = glue::bufferOf(result);
      sim::BufferPtr simulated = sim::metal::bufferOf(out);
      const uint64_t committed = stream->pendingCommitPoint();
      dispatch_queue_t queue = (__bridge dispatch_queue_t)hooks.getDispatchQueue();
      // Shared with the block, which may still be returning from set_value()
      // when this thread has its value.
      auto done = std::make_shared<std::promise<int>>();
      dispatch_async(queue, ^() {
        @autoreleasepool {
          id<MTLCommandBuffer> buffer = (__bridge id<MTLCommandBuffer>)hooks.getCommandBuffer();
          id<MTLComputeCommandEncoder> encoder = [buffer computeCommandEncoder];
          sim::metal::dispatchKernel(encoder, {out}, [simulated] {
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
            glue::words(*simulated)[0] = 7;
          });
          [encoder endEncoding];
          hooks.commitStream();
        }
        done->set_value(glue::leasedSlots());
      });
      EXPECT_EQ(done->get_future().get(), 1) << "leased streams while the block ran";
      EXPECT_GT(stream->pendingCommitPoint(), committed);
      stream->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_EQ(glue::words(out)[0], 7);
    }
  }).join();
}

// The blit paths: fill and copy on a worker stream, read on the CPU.
TEST_F(GlueTest, FillAndCopyOnWorkerStreams) {
  glue::onThreads(4, [](int t) {
    c10::DataPtr a = glue::allocated(4096);
    c10::DataPtr b = glue::allocated(4096);
    MPSStream* stream = at::mps::getCurrentMPSStream();
    stream->fill(glue::bufferOf(a), uint8_t(0x10 + t), 4096, 0);
    stream->copy_and_sync(glue::bufferOf(a), glue::bufferOf(b), 2048, 0, 1024, /*non_blocking=*/false, 0);
    auto* bytes = sim::metal::bufferOf(glue::bufferOf(b))->contents();
    EXPECT_EQ(bytes[1024], 0x10 + t);
    EXPECT_EQ(bytes[3071], 0x10 + t);
  });
}

} // namespace
