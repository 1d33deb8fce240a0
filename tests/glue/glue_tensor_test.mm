// What ops use from OperationUtils (mtl_setArgs binding MPS tensors, the
// graph path, the kernel cache) and aten::record_stream's MPS kernel
// (RecordStream.mm), reached through the dispatcher as Tensor.record_stream
// reaches it.

#include "GlueTest.h"

#include <ATen/core/Tensor.h>
#include <ATen/native/mps/OperationUtils.h>
#include <c10/core/StreamGuard.h>
#include <dispatch/dispatch.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

// A kernel object for the kernel cache (the simulated frameworks implement no
// MPSKernel class).
@interface GlueKernel : NSObject
@end
@implementation GlueKernel
@end

namespace {

using glue::GlueTest;

// A custom-kernel op on stream `s`, as ops encode one: in the stream's serial
// section, its compute encoder, the tensor bound with mtl_setArgs (whose
// getMTLBufferStorage() records the use with the dependency tracker), one
// dispatch whose body runs on the simulated GPU; then committed.
void encodeBinding(const c10::Stream& s, const at::Tensor& t, std::function<void()> body) {
  c10::StreamGuard guard(s);
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  @autoreleasepool {
    dispatch_sync(stream->queue(), ^() {
      id<MTLComputeCommandEncoder> encoder = stream->commandEncoder();
      at::native::mps::mtl_setArgs(encoder, t);
      sim::metal::dispatchKernel(encoder, {}, body);
    });
  }
  stream->synchronize(at::mps::SyncType::COMMIT);
}

// A kernel on stream B that binds a tensor stream A's kernel is still
// writing runs after it, with no event or synchronization call: the
// fixture's hazard detector (no two queues on one buffer at once with a
// write) is the judge, and B's kernel must read A's value. Without the
// dependency hook in getMTLBufferStorage() both fail.
TEST_F(GlueTest, KernelBindingATensorWithMtlSetArgsRunsAfterAnotherStreamsWrite) {
  constexpr int kRounds = 20;
  for (int r = 0; r < kRounds; ++r) {
    at::Tensor t = glue::mpsTensor(64);
    sim::BufferPtr buffer = sim::metal::bufferOf(glue::bufferOf(t));
    auto seen = std::make_shared<std::atomic<int64_t>>(-1);
    encodeBinding(at::mps::getMPSStream(2 + r % 3)->unwrap(), t, [buffer, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      glue::words(*buffer)[0] = r + 1;
    });
    at::mps::MPSStream* b = at::mps::getMPSStream(5 + r % 3);
    encodeBinding(b->unwrap(), t, [buffer, seen] { seen->store(glue::words(*buffer)[0]); });
    b->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    EXPECT_EQ(seen->load(), r + 1) << "round " << r;
  }
}

// The MPSGraph path of an op through OperationUtils: the graph cache,
// Placeholder and runMPSGraph. The stand-in graph copies its feed into its
// result.
at::native::mps::MPSUnaryCachedGraph* copyGraph(const at::Tensor& x, const at::Tensor& y) {
  using namespace at::native::mps;
  return LookUpOrCreateCachedGraph<MPSUnaryCachedGraph>("glue_copy:" + getTensorsStringKey({x, y}),
                                                        [&](MPSGraph* graph, MPSUnaryCachedGraph* cached) {
                                                          cached->inputTensor_ = mpsGraphRankedPlaceHolder(graph, x);
                                                          cached->outputTensor_ = mpsGraphRankedPlaceHolder(graph, y);
                                                        });
}

void runCopyGraph(const at::Tensor& x, const at::Tensor& y) {
  using namespace at::native::mps;
  @autoreleasepool {
    MPSUnaryCachedGraph* cached = copyGraph(x, y);
    Placeholder in(cached->inputTensor_, x);
    Placeholder out(cached->outputTensor_, y);
    runMPSGraph(at::mps::getCurrentMPSStream(),
                cached->graph(),
                dictionaryFromPlaceholders(in),
                dictionaryFromPlaceholders(out));
  }
}

// A graph on stream B fed a tensor that stream A's kernel is still writing
// runs after it, with no event: Placeholder notes the tensor's buffer for
// the feed, and the stream orders the graph after A's write.
TEST_F(GlueTest, GraphFedATensorThroughPlaceholderRunsAfterAnotherStreamsWrite) {
  constexpr int kRounds = 20;
  for (int r = 0; r < kRounds; ++r) {
    at::Tensor x = glue::mpsTensor(64);
    at::Tensor y = glue::mpsTensor(64);
    sim::BufferPtr buffer = sim::metal::bufferOf(glue::bufferOf(x));
    encodeBinding(at::mps::getMPSStream(2 + r % 3)->unwrap(), x, [buffer, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      glue::words(*buffer)[0] = r + 1;
    });
    at::mps::MPSStream* b = at::mps::getMPSStream(5 + r % 3);
    {
      c10::StreamGuard guard(b->unwrap());
      runCopyGraph(x, y);
    }
    b->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    EXPECT_EQ(glue::words(glue::bufferOf(y))[0], r + 1) << "round " << r;
  }
}

// Threads with streams of their own running one cached graph are built one
// graph and encode it one at a time (runMPSGraph's encode guard; the
// simulated MPSGraph aborts on overlapping encodes of one graph), each
// getting its own result.
TEST_F(GlueTest, OneCachedGraphRunsOnManyThreadsOneEncodeAtATime) {
  constexpr int kThreads = 8;
  constexpr int kRuns = 10;
  glue::onThreads(kThreads, [](int t) {
    at::Tensor x = glue::mpsTensor(16);
    at::Tensor y = glue::mpsTensor(16);
    sim::BufferPtr buffer = sim::metal::bufferOf(glue::bufferOf(x));
    for (int r = 0; r < kRuns; ++r) {
      encodeBinding(
          at::mps::getCurrentMPSStream()->unwrap(), x, [buffer, t, r] { glue::words(*buffer)[0] = t * 1000 + r; });
      runCopyGraph(x, y);
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
      EXPECT_EQ(glue::words(glue::bufferOf(y))[0], t * 1000 + r);
    }
  });
  EXPECT_EQ(copyGraph(glue::mpsTensor(16), glue::mpsTensor(16)), copyGraph(glue::mpsTensor(16), glue::mpsTensor(16)));
}

// Ops on many threads asking MPSKernelCache for one key get one kernel,
// created once, and the family lock that every encode of it holds lets one
// thread encode it at a time (Note [MPS graph and kernel caches]).
TEST_F(GlueTest, CachedKernelIsCreatedOnceAndItsEncodesNeverOverlap) {
  using at::native::mps::MPSCachedKernel;
  constexpr int kThreads = 12;
  constexpr int kEncodes = 40;
  std::atomic<int> created{0}, inside{0}, most_inside{0};
  std::vector<NSObject*> kernels(kThreads);
  glue::onThreads(kThreads, [&](int i) {
    MPSCachedKernel* cached = at::native::mps::LookUpOrCreateCachedKernel<MPSCachedKernel>("glue_kernel", [&] {
      created.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(5)); // others ask meanwhile
      return (MPSKernel*)[[GlueKernel alloc] init];
    });
    kernels[i] = cached->kernel<NSObject>();
    for (int e = 0; e < kEncodes; ++e) {
      at::mps::SerializedEncode serialized(at::mps::RacyKernelFamily::kMatrixMultiplication);
      const int now = inside.fetch_add(1) + 1;
      int most = most_inside.load();
      while (now > most && !most_inside.compare_exchange_weak(most, now)) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      inside.fetch_sub(1);
    }
  });
  EXPECT_EQ(created.load(), 1);
  EXPECT_EQ(std::count(kernels.begin(), kernels.end(), kernels[0]), kThreads);
  EXPECT_EQ(most_inside.load(), 1);
}

// A tensor allocated on the default stream and used by a kernel on worker
// stream B, then freed: after Tensor.record_stream(B) no thread gets its
// block while B's kernel may still run. The fixture's hazard check at every
// handout is the judge; without the kernel's recordStream() the block goes
// back to the default stream's cache at once.
TEST_F(GlueTest, TensorRecordStreamKeepsTheBlockFromReuseUntilTheUseCompleted) {
  constexpr int kRounds = 40;
  for (int r = 0; r < kRounds; ++r) {
    at::Tensor t = glue::mpsTensor(512);
    const c10::Stream b = at::mps::getMPSStream(2 + r % 6)->unwrap();
    glue::encodeSlowUseOn(b, glue::bufferOf(t));
    t.record_stream(b);
    t.reset();
    std::thread([] { glue::allocated(4096); }).join();
    glue::allocated(4096);
  }
}

// Also for an empty tensor, which has no block for the allocator to check.
TEST_F(GlueTest, TensorRecordStreamOnAStreamOfAnotherDeviceTypeIsAnErrorNamingIt) {
  const c10::Stream cpu(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
  for (int64_t elements : {8, 0}) {
    at::Tensor t = glue::mpsTensor(elements);
    try {
      t.record_stream(cpu);
      ADD_FAILURE() << "record_stream accepted a CPU stream for an MPS tensor of " << elements << " elements";
    } catch (const c10::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("record_stream: expected an MPS stream, got"), std::string::npos) << what;
      EXPECT_NE(what.find("cpu"), std::string::npos) << what;
    }
  }
}

} // namespace
