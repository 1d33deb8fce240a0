#include "GlueTest.h"

#include <ATen/EmptyTensor.h>
#include <ATen/mps/MPSAllocatorInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/native/mps/Copy.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/view_native.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/core/TensorImpl.h>
#include <dispatch/dispatch.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

namespace {

// The MPS kernels of the ATen ops that the ops the glue builds call, which
// the Linux wheel does not register: a new output (of given strides, as
// empty_like asks for), and views of it.
at::Tensor emptyMPS(c10::SymIntArrayRef size,
                    std::optional<at::ScalarType> dtype,
                    std::optional<at::Layout> layout,
                    std::optional<at::Device> device,
                    std::optional<bool> pin_memory,
                    std::optional<at::MemoryFormat> memory_format) {
  return at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size),
                                   at::mps::getIMPSAllocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::MPS),
                                   dtype.value_or(at::kFloat),
                                   memory_format);
}

at::Tensor emptyStridedMPS(c10::SymIntArrayRef size,
                           c10::SymIntArrayRef stride,
                           std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout> layout,
                           std::optional<at::Device> device,
                           std::optional<bool> pin_memory) {
  return at::detail::empty_strided_generic(C10_AS_INTARRAYREF_SLOW(size),
                                           C10_AS_INTARRAYREF_SLOW(stride),
                                           at::mps::getIMPSAllocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::MPS),
                                           dtype.value_or(at::kFloat));
}

at::Tensor viewMPS(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor asStridedMPS(const at::Tensor& self,
                        c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride,
                        std::optional<c10::SymInt> storage_offset) {
  return at::native::as_strided_tensorimpl(self,
                                           C10_AS_INTARRAYREF_SLOW(size),
                                           C10_AS_INTARRAYREF_SLOW(stride),
                                           storage_offset ? std::optional(storage_offset->expect_int()) : std::nullopt);
}

// fill_, zero_, add_, linalg_vector_norm and mul.out, which ops call
// around their kernels (and add_ of a tensor, which autograd's
// AccumulateGrad calls): a kernel on the current stream that records every
// tensor's buffer as written and applies the CPU's op to views of them;
// copy_ is the patched Copy.mm's.
void encodeOnElements(const std::vector<at::Tensor>& tensors, std::function<void(std::vector<at::Tensor>)> op) {
  struct View {
    sim::BufferPtr buffer;
    int64_t offset;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype;
  };
  std::vector<id<MTLBuffer>> buffers;
  std::vector<View> views;
  for (const at::Tensor& t : tensors) {
    buffers.push_back(glue::bufferOf(t));
    views.push_back({sim::metal::bufferOf(buffers.back()),
                     t.storage_offset() * t.element_size(),
                     t.sizes().vec(),
                     t.strides().vec(),
                     t.scalar_type()});
  }
  glue::encodeKernel(buffers, [views = std::move(views), op = std::move(op)] {
    std::vector<at::Tensor> on_cpu;
    for (const View& v : views) {
      on_cpu.push_back(at::from_blob(v.buffer->contents() + v.offset, v.sizes, v.strides, at::TensorOptions(v.dtype)));
    }
    op(std::move(on_cpu));
  });
}

at::Tensor& fillMPS(at::Tensor& self, const at::Scalar& value) {
  encodeOnElements({self}, [value](std::vector<at::Tensor> t) { t[0].fill_(value); });
  return self;
}

at::Tensor& zeroMPS(at::Tensor& self) {
  return fillMPS(self, 0);
}

at::Tensor& addScalarMPS(at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  encodeOnElements({self}, [other, alpha](std::vector<at::Tensor> t) { t[0].add_(other, alpha); });
  return self;
}

at::Tensor& addTensorMPS(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  encodeOnElements({self, other}, [alpha](std::vector<at::Tensor> t) { t[0].add_(t[1], alpha); });
  return self;
}

at::Tensor linalgVectorNormMPS(const at::Tensor& self,
                               const at::Scalar& ord,
                               at::OptionalIntArrayRef dim,
                               bool keepdim,
                               std::optional<at::ScalarType> dtype) {
  const std::optional<std::vector<int64_t>> dims = dim ? std::make_optional(dim->vec()) : std::nullopt;
  const at::Tensor shape =
      at::linalg_vector_norm(at::empty(self.sizes(), self.options().device(at::kMeta)), ord, dim, keepdim, dtype);
  at::Tensor out = at::empty(shape.sizes(), self.options().dtype(shape.scalar_type()));
  encodeOnElements({self, out}, [ord, dims, keepdim, dtype](std::vector<at::Tensor> t) {
    at::linalg_vector_norm_out(t[1], t[0], ord, dims ? at::OptionalIntArrayRef(*dims) : std::nullopt, keepdim, dtype);
  });
  return out;
}

at::Tensor& mulOutMPS(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  encodeOnElements({self, other, out}, [](std::vector<at::Tensor> t) { at::mul_out(t[2], t[0], t[1]); });
  return out;
}

at::Tensor& copyMPS(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  return at::native::mps::mps_copy_(self, src, non_blocking);
}

// resize_ of an output: the CPU's resize of sizes and strides, growing only
// an empty storage, through its allocator (the MPS one); a storage with
// contents would need a copy on the GPU.
const at::Tensor& resizeMPS(const at::Tensor& self,
                            c10::SymIntArrayRef size,
                            std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!memory_format || *memory_format == at::MemoryFormat::Contiguous,
              "the glue's resize_ supports contiguous tensors only, not ",
              *memory_format);
  const at::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  const size_t bytes = c10::multiply_integers(sizes) * self.element_size();
  TORCH_CHECK(self.storage().nbytes() == 0 || bytes <= self.storage().nbytes(),
              "the glue's resize_ grows only an empty storage, not one of ",
              self.storage().nbytes(),
              " bytes");
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), sizes, std::nullopt);
  return self;
}

TORCH_LIBRARY_IMPL(aten, MPS, m) {
  m.impl("empty.memory_format", TORCH_FN(emptyMPS));
  m.impl("empty_strided", TORCH_FN(emptyStridedMPS));
  m.impl("view", TORCH_FN(viewMPS));
  m.impl("as_strided", TORCH_FN(asStridedMPS));
  m.impl("fill_.Scalar", TORCH_FN(fillMPS));
  m.impl("zero_", TORCH_FN(zeroMPS));
  m.impl("add_.Scalar", TORCH_FN(addScalarMPS));
  m.impl("add_.Tensor", TORCH_FN(addTensorMPS));
  m.impl("linalg_vector_norm", TORCH_FN(linalgVectorNormMPS));
  m.impl("mul.out", TORCH_FN(mulOutMPS));
  m.impl("copy_", TORCH_FN(copyMPS));
  m.impl("resize_", TORCH_FN(resizeMPS));
}

} // namespace

namespace glue {

void GlueTest::SetUp() {
  sim::metal::device().hazards().clear();
}

void GlueTest::TearDown() {
  at::mps::getMPSStreamPool().synchronizeAll();
  sim::metal::device().waitIdle();
  std::string reports;
  for (const std::string& report : sim::metal::device().hazards().reports()) {
    reports += "\n  " + report;
  }
  EXPECT_EQ(sim::metal::device().hazards().count(), 0u) << "hazards:" << reports;
}

c10::DataPtr allocated(size_t bytes) {
  c10::DataPtr data = at::mps::getIMPSAllocator()->allocate(bytes);
  id<MTLCommandQueue> queue = at::mps::getCurrentMPSStream()->commandQueue();
  sim::metal::device().hazards().checkHandout(*sim::metal::bufferOf(bufferOf(data)), &sim::metal::queueOf(queue));
  return data;
}

at::Tensor mpsTensor(int64_t elements, at::ScalarType dtype) {
  c10::Storage storage(c10::Storage::use_byte_size_t(),
                       elements * c10::elementSize(dtype),
                       at::mps::getIMPSAllocator(),
                       /*resizable=*/false);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::MPS), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous({elements});
  return t;
}

at::Tensor toMPS(const at::Tensor& cpu) {
  if (!cpu.defined()) {
    return {};
  }
  at::Tensor t = mpsTensor(cpu.numel(), cpu.scalar_type()).view(cpu.sizes());
  // The block may come back from work queued on this stream, which another
  // thread sharing the stream can have encoded: a write from the host waits
  // for that work first.
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  std::memcpy(sim::metal::bufferOf(bufferOf(t))->contents(), cpu.const_data_ptr(), cpu.nbytes());
  return t;
}

at::Tensor toCPU(const at::Tensor& mps) {
  return at::from_blob(sim::metal::bufferOf(bufferOf(mps))->contents(), mps.sizes(), mps.scalar_type()).clone();
}

void expectClose(const at::Tensor& got, const at::Tensor& expected, const char* what) {
  ASSERT_EQ(got.scalar_type(), expected.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  const double tolerance = got.scalar_type() == at::kHalf ? 2e-3 : 1e-5;
  const at::Tensor g = got.to(at::kFloat).contiguous(), e = expected.to(at::kFloat).contiguous();
  const float* gv = g.const_data_ptr<float>();
  const float* ev = e.const_data_ptr<float>();
  for (int64_t i = 0; i < g.numel(); ++i) {
    ASSERT_NEAR(gv[i], ev[i], tolerance * (1 + std::abs(ev[i]))) << what << "[" << i << "]";
  }
}

int64_t* words(sim::Buffer& buffer) {
  return reinterpret_cast<int64_t*>(buffer.contents());
}

int64_t* words(id<MTLBuffer> buffer) {
  return words(*sim::metal::bufferOf(buffer));
}

at::Tensor floats(const sim::BufferPtr& buffer, at::IntArrayRef sizes) {
  return at::from_blob(buffer->contents(), sizes, at::kFloat);
}

void encodeKernel(const std::vector<id<MTLBuffer>>& buffers, std::function<void()> body, Tracking tracking) {
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  @autoreleasepool {
    dispatch_sync(stream->queue(), ^() {
      id<MTLComputeCommandEncoder> encoder = stream->commandEncoder();
      for (id<MTLBuffer> buffer : buffers) {
        if (tracking == Tracking::kTracked) {
          at::mps::trackMPSBufferUseInPass((__bridge const void*)buffer);
        }
      }
      sim::metal::dispatchKernel(encoder, buffers, body);
    });
  }
}

void encodeSlowUseOn(const c10::Stream& s, id<MTLBuffer> buffer) {
  c10::StreamGuard guard(s);
  encodeKernel({buffer}, [] { std::this_thread::sleep_for(std::chrono::microseconds(500)); });
  at::mps::getCurrentMPSStream()->synchronize(at::mps::SyncType::COMMIT);
}

void encodeIncrement(id<MTLBuffer> buffer) {
  sim::BufferPtr b = sim::metal::bufferOf(buffer);
  encodeKernel({buffer}, [b] {
    auto* w = words(*b);
    for (size_t i = 0; i < b->bytes() / sizeof(int64_t); ++i) {
      w[i] += 1;
    }
  });
}

void encodeCopy(id<MTLBuffer> src, id<MTLBuffer> dst) {
  sim::BufferPtr s = sim::metal::bufferOf(src);
  sim::BufferPtr d = sim::metal::bufferOf(dst);
  encodeKernel({src, dst}, [s, d] { std::memmove(d->contents(), s->contents(), std::min(s->bytes(), d->bytes())); });
}

int64_t trackerWaits() {
  return sim::metal::eventWaits();
}

void onThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&fn, i] {
      // The pool also drains the ones an error left open on its way out.
      @autoreleasepool {
        try {
          fn(i);
        } catch (const c10::Error& e) {
          ADD_FAILURE() << "thread " << i << ": " << e.what_without_backtrace();
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
}

OtherThreadOnStream::OtherThreadOnStream(at::mps::MPSStream* stream, std::function<void(int)> then)
    : thread_([this, stream, then = std::move(then)] {
        c10::StreamGuard guard(stream->unwrap());
        const at::Tensor scratch = mpsTensor(8);
        id<MTLBuffer> buffer = bufferOf(scratch);
        for (int i = 0; !done_.load(); ++i) {
          @autoreleasepool {
            encodeKernel({buffer}, [] {});
            dispatch_sync(stream->queue(), ^() {
              then(i);
            });
          }
        }
      }) {}

OtherThreadOnStream::~OtherThreadOnStream() {
  done_ = true;
  thread_.join();
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

} // namespace glue
