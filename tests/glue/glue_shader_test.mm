// MetalShaderLibrary and MetalKernelFunction (OperationUtils.mm) from many
// threads: the shader libraries and pipeline states that ops share, and the
// path of torch.mps.compile_shader's kernels. The simulated compiler
// (SimMetalRuntime.h) counts its compiles and runs the bodies defineKernel()
// gives.

#include "GlueTest.h"

#include <ATen/TensorIterator.h>
#include <ATen/detail/MPSHooksInterface.h>
#include <ATen/native/mps/MetalShaderLibrary.h>
#include <ATen/native/mps/OperationUtils.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using at::native::mps::MetalShaderLibrary;
using glue::GlueTest;

// A new library that lives as long as the process, as the ops' static ones
// do (a library never releases the libraries it compiled). Made in an
// autorelease pool: a DynamicMetalShaderLibrary compiles in its constructor.
template <typename Library, typename... Args>
Library& processLifetime(Args&&... args) {
  static auto* libraries = new std::vector<std::unique_ptr<MetalShaderLibrary>>();
  @autoreleasepool {
    libraries->push_back(std::make_unique<Library>(std::forward<Args>(args)...));
  }
  return static_cast<Library&>(*libraries->back());
}

// Ops on many threads asking one library for its pipeline states get one
// compile of the library and one pipeline state per function, each the same
// object for every thread; a parametrized library compiles once per
// parameter list (Note [MPS create-once cache]).
TEST_F(GlueTest, ShaderLibraryCompilesOnceAndBuildsEachPipelineOnceForManyThreads) {
  auto& plain = processLifetime<MetalShaderLibrary>(
      "kernel void glue_add_one(device long* data) {}\nkernel void glue_copy(device long* a, device long* b) {}\n");
  auto& templated = processLifetime<MetalShaderLibrary>("kernel void glue_fill_{}(device long* data) {{}}\n", 1u);
  constexpr int kThreads = 12;
  const std::vector<std::string> functions = {"glue_add_one", "glue_copy"};
  std::vector<std::vector<id<MTLComputePipelineState>>> plain_seen(kThreads), templated_seen(kThreads);
  const sim::metal::CompilerCounts before = sim::metal::compilerCounts();
  glue::onThreads(kThreads, [&](int t) {
    @autoreleasepool {
      for (int round = 0; round < 3; ++round) {
        plain_seen[t].push_back(plain.getPipelineStateForFunc(functions[(t + round) % 2]));
        const std::string variant = (t + round) % 2 ? "a" : "b";
        templated_seen[t].push_back(templated.getPipelineStateForFunc("glue_fill_" + variant, {variant}));
      }
    }
  });
  const sim::metal::CompilerCounts after = sim::metal::compilerCounts();
  EXPECT_EQ(after.libraries - before.libraries, 1 + 2);
  EXPECT_EQ(after.pipelines - before.pipelines, 2 + 2);
  for (int t = 0; t < kThreads; ++t) {
    for (int round = 0; round < 3; ++round) {
      const int which = (t + round) % 2;
      EXPECT_EQ(plain_seen[t][round], plain_seen[which][0]) << "thread " << t << " round " << round;
      EXPECT_EQ(templated_seen[t][round], templated_seen[which][0]) << "thread " << t << " round " << round;
    }
  }
  EXPECT_NE(plain_seen[0][0], plain_seen[1][0]);
  EXPECT_NE(templated_seen[0][0], templated_seen[1][0]);
  @autoreleasepool {
    EXPECT_EQ(plain.getFunctionNames(), functions);
    // A parametrized library has no one list of functions, whichever
    // variants compiled.
    try {
      templated.getFunctionNames();
      ADD_FAILURE() << "getFunctionNames listed the functions of a library with parameters";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("getFunctionNames: a shader library with parameters"), std::string::npos)
          << e.what();
    }
  }
}

// A shader that does not compile raises Metal's message as c10::SyntaxError
// to every caller, including those that waited for another thread's compile,
// and nothing is cached: each request compiles again.
TEST_F(GlueTest, ShaderCompileErrorReachesEveryCallerAndIsNotCached) {
  auto& broken = processLifetime<MetalShaderLibrary>("#error glue: no such type 'flaot'\nkernel void glue_k() {}\n");
  constexpr int kThreads = 8;
  std::atomic<int> syntax_errors{0};
  const sim::metal::CompilerCounts before = sim::metal::compilerCounts();
  glue::onThreads(kThreads, [&](int) {
    @autoreleasepool {
      try {
        broken.getPipelineStateForFunc("glue_k");
        ADD_FAILURE() << "a library that does not compile returned a pipeline state";
      } catch (const c10::SyntaxError& e) {
        EXPECT_NE(std::string(e.what()).find("no such type 'flaot'"), std::string::npos) << e.what();
        syntax_errors.fetch_add(1);
      }
    }
  });
  EXPECT_EQ(syntax_errors.load(), kThreads);
  EXPECT_EQ(sim::metal::compilerCounts().libraries - before.libraries, kThreads);
  @autoreleasepool {
    EXPECT_THROW(broken.getPipelineStateForFunc("glue_k"), c10::SyntaxError);
  }
  EXPECT_EQ(sim::metal::compilerCounts().libraries - before.libraries, kThreads + 1);
}

// torch.mps.compile_shader's kernels (DynamicMetalShaderLibrary,
// MetalKernelFunction) on threads with streams of their own, all
// incrementing one tensor with no event: setArg's binding orders each
// increment after the others' (Note [MPS cross-stream dependencies]), so none
// is lost and no two overlap on the GPU.
TEST_F(GlueTest, CompiledShaderKernelsOnManyStreamsOrderTheirWritesToOneTensor) {
  sim::metal::defineKernel("glue_add_one", [](const std::vector<sim::BufferPtr>& buffers) {
    int64_t* value = glue::words(*buffers.at(0));
    const int64_t read = *value;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    *value = read + 1;
  });
  auto& library = processLifetime<at::native::mps::DynamicMetalShaderLibrary>(
      "kernel void glue_add_one(device long* data, uint index [[thread_position_in_grid]]) {}\n");
  at::Tensor counter = glue::mpsTensor(1);
  glue::encodeKernel({glue::bufferOf(counter)},
                     [b = sim::metal::bufferOf(glue::bufferOf(counter))] { glue::words(*b)[0] = 0; });
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
  constexpr int kThreads = 8;
  constexpr int kIncrements = 25;
  glue::onThreads(kThreads, [&](int) {
    std::shared_ptr<at::native::mps::MetalKernelFunction> kernel;
    @autoreleasepool {
      kernel = library.getKernelFunction("glue_add_one");
    }
    for (int i = 0; i < kIncrements; ++i) {
      kernel->runCommandBlock([&] {
        kernel->startEncoding();
        kernel->setArg(0, counter);
        kernel->dispatch(1);
      });
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
    }
  });
  at::detail::getMPSHooks().deviceSynchronize();
  EXPECT_EQ(glue::words(glue::bufferOf(counter))[0], kThreads * kIncrements);
}

constexpr int64_t kWords = 16;

// A tensor of `words` int64 words, all `value`, written by a kernel on the
// calling thread's stream.
at::Tensor filled(int64_t value, int64_t words = kWords) {
  at::Tensor t = glue::mpsTensor(words);
  glue::encodeKernel({glue::bufferOf(t)}, [b = sim::metal::bufferOf(glue::bufferOf(t)), value, words] {
    std::fill_n(glue::words(*b), words, value);
  });
  return t;
}

// Elementwise ops run through exec_binary_kernel: a TensorIterator over the
// operands, the library's pipeline state looked up on every call, each
// operand bound through the dependency hook. 8 threads with streams of their
// own add one to the same accumulator in place, 10 times each, with no
// event (a read, a 100 µs pause, a write per element on the simulated GPU):
// no addition is lost and no two overlap.
TEST_F(GlueTest, ElementwiseOpsOnManyStreamsAccumulateIntoOneTensor) {
  constexpr int64_t kElements = 64;
  sim::metal::defineKernel("glue_add_dense_long_long", [](const std::vector<sim::BufferPtr>& buffers) {
    auto* out = glue::words(*buffers.at(0));
    const auto* a = glue::words(*buffers.at(1));
    const auto* b = glue::words(*buffers.at(2));
    std::vector<int64_t> sum(kElements);
    for (int64_t i = 0; i < kElements; ++i) {
      sum[i] = a[i] + b[i];
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::copy(sum.begin(), sum.end(), out);
  });
  auto& library = processLifetime<MetalShaderLibrary>(
      "kernel void glue_add_dense_long_long(device long* out, constant long* a, constant long* b) {}\n");
  at::Tensor acc = filled(0, kElements);
  at::Tensor one = filled(1, kElements);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
  constexpr int kThreads = 8;
  constexpr int kAdds = 10;
  glue::onThreads(kThreads, [&](int) {
    for (int i = 0; i < kAdds; ++i) {
      auto iter = at::TensorIteratorConfig().add_output(acc).add_const_input(acc).add_const_input(one).build();
      library.exec_binary_kernel(iter, "glue_add");
      at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
    }
  });
  at::detail::getMPSHooks().deviceSynchronize();
  const int64_t* values = glue::words(glue::bufferOf(acc));
  EXPECT_EQ(std::count(values, values + kElements, kThreads * kAdds), kElements) << "acc[0] = " << values[0];
}

// The body of glue_mul's kernel: out = a * b.
void multiplyWords(const std::vector<sim::BufferPtr>& buffers) {
  int64_t* out = glue::words(*buffers.at(0));
  const int64_t* a = glue::words(*buffers.at(1));
  const int64_t* b = glue::words(*buffers.at(2));
  for (int64_t i = 0; i < kWords; ++i) {
    out[i] = a[i] * b[i];
  }
}

// out = a * b as an elementwise op does it (exec_binary_kernel), on the
// calling thread's stream, committed.
void multiply(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  static auto& library = processLifetime<MetalShaderLibrary>(
      "kernel void glue_mul_dense_long_long(device long* out, constant long* a, constant long* b) {}\n");
  auto iter = at::TensorIteratorConfig().add_output(out).add_const_input(a).add_const_input(b).build();
  library.exec_binary_kernel(iter, "glue_mul");
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
}

// Runs `first` on one thread, then `second` on another once `first` has
// returned. Both threads live until both are done, so each keeps a stream of
// its own.
void oneAfterTheOther(const std::function<void()>& first, const std::function<void()>& second) {
  std::atomic<int> done{0};
  glue::onThreads(2, [&](int t) {
    if (t == 1) {
      glue::eventually([&] { return done.load() == 1; });
    }
    (t == 0 ? first : second)();
    done.fetch_add(1);
    glue::eventually([&] { return done.load() == 2; });
  });
}

// Streams reading one tensor (a weight) through elementwise ops never wait
// for each other: a TensorIterator's inputs are bound as reads. The second
// stream's op completes while the first stream's kernel, which reads the
// same tensor, is still running.
TEST_F(GlueTest, StreamsReadingOneTensorThroughElementwiseOpsDoNotWaitForEachOther) {
  std::atomic<int> dispatches{0};
  std::atomic<bool> release{false};
  std::atomic<bool> first_done{false};
  sim::metal::defineKernel("glue_mul_dense_long_long", [&](const std::vector<sim::BufferPtr>& buffers) {
    const bool first = dispatches.fetch_add(1) == 0;
    if (first) {
      glue::eventually([&] { return release.load(); });
    }
    multiplyWords(buffers);
    if (first) {
      first_done.store(true);
    }
  });
  at::Tensor weight = filled(3), x0 = filled(1), x1 = filled(2), out0 = filled(0), out1 = filled(0);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  const int64_t waits_before = glue::trackerWaits();
  bool first_was_running = false;
  oneAfterTheOther([&] { multiply(out0, weight, x0); },
                   [&] {
                     glue::eventually([&] { return dispatches.load() == 1; });
                     multiply(out1, weight, x1);
                     at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
                     first_was_running = !first_done.load();
                     release.store(true);
                   });
  at::detail::getMPSHooks().deviceSynchronize();
  EXPECT_TRUE(first_was_running) << "the second op waited for the first one's kernel";
  EXPECT_EQ(glue::trackerWaits() - waits_before, 0);
  EXPECT_EQ(glue::words(glue::bufferOf(out0))[kWords - 1], 3);
  EXPECT_EQ(glue::words(glue::bufferOf(out1))[kWords - 1], 6);
}

// A TensorIterator input is still ordered after other streams' writes: the
// op reads what a kernel of another stream, still running when the op binds
// the tensor, wrote.
TEST_F(GlueTest, ElementwiseOpInputWaitsForAnotherStreamsWrite) {
  sim::metal::defineKernel("glue_mul_dense_long_long", multiplyWords);
  at::Tensor weight = filled(0), x = filled(2), out = filled(0);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  std::atomic<bool> reading{false};
  oneAfterTheOther(
      [&] {
        glue::encodeKernel({glue::bufferOf(weight)}, [&, w = sim::metal::bufferOf(glue::bufferOf(weight))] {
          glue::eventually([&] { return reading.load(); });
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          std::fill_n(glue::words(*w), kWords, 5);
        });
        at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
      },
      [&] {
        reading.store(true);
        multiply(out, weight, x);
      });
  at::detail::getMPSHooks().deviceSynchronize();
  const int64_t* values = glue::words(glue::bufferOf(out));
  EXPECT_EQ(std::count(values, values + kWords, 10), kWords) << "out[0] = " << values[0];
}

// A TensorIterator output waits for another stream's kernel that still reads
// the tensor as an input: that kernel reads the old values.
TEST_F(GlueTest, ElementwiseOpOutputWaitsForAnotherStreamsRead) {
  std::atomic<int> dispatches{0};
  sim::metal::defineKernel("glue_mul_dense_long_long", [&](const std::vector<sim::BufferPtr>& buffers) {
    if (dispatches.fetch_add(1) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    multiplyWords(buffers);
  });
  at::Tensor weight = filled(3), x = filled(2), out = filled(0);
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  oneAfterTheOther([&] { multiply(out, weight, x); }, [&] { multiply(weight, x, x); });
  at::detail::getMPSHooks().deviceSynchronize();
  EXPECT_EQ(glue::words(glue::bufferOf(out))[0], 6) << "the read saw the later write";
  EXPECT_EQ(glue::words(glue::bufferOf(weight))[0], 4);
}

} // namespace
