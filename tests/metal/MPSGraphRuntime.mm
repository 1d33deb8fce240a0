// Stand-in for MPSGraph execution: every graph is one kernel that reads the
// buffers of its feeds and writes those of its results, encoded in its own
// compute encoder pass as MPSGraph encodes. The kernel evaluates, in double
// precision, the few operations the stand-in implements (Note [simulated
// MPSGraph operations]); a result that is a placeholder of its own gets the
// first feed's bytes, which is all the tests' copy graphs need. With
// enableCommitAndContinue set, it then commits and continues the command
// buffer, which MPSGraph may do for large graphs; here it always does, the
// case the stream's command-buffer bookkeeping finds hardest. Two threads
// encoding one graph at once abort (GraphState).
//
// Also here, as it shares the graph's arithmetic: MPSNDArray views and the
// one MPSNDArray kernel the glue runs, the matrix multiplication of
// nn.Linear's Metal-kernel path (Note [simulated MPSNDArray]).

#include "SimMetalRuntime.h"
#include "SimObjC.h"

#include <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using sim::objc::state;

namespace {

struct Stateless {};

// Concurrent encoding of one MPSGraph is undocumented, so the simulator
// treats it as the race it may be: a second thread entering an encode of a
// graph another thread is encoding aborts. Each encode lasts a while, so
// that overlaps are not missed.
//
// A graph owns the tensors it makes, as MPSGraph does: cached graphs keep
// their placeholders past the autorelease pool they were made in.
struct GraphState {
  std::atomic<int> encoders{0};
  std::vector<MPSGraphTensor*> tensors;
  ~GraphState() {
    for (MPSGraphTensor* t : tensors) {
      [t release];
    }
  }
};
constexpr std::chrono::microseconds kGraphEncodeTime{30};

// Note [simulated MPSGraph operations]
// Placeholders, scalar constants, casts, mean and variance over axes (the
// reduced axes kept with size 1, as MPSGraph's reductions return them),
// addition, subtraction and multiplication with NumPy-style broadcasting,
// the reciprocal square root, the transpose of two dimensions, matrix
// multiplication over the two last dimensions (the others broadcast), and
// reshapes (flatten2DTensor:axis: keeps the dimensions before `axis` as
// rows and the others as columns). The variance divides by the element
// count: v2.9.1's batch norm multiplies MPSGraph's variance by N / (N - 1)
// for the unbiased running variance. Elements are int32, int64, float16
// (rounded to nearest even) or float32; a feed or result whose data type or
// element count differs from its tensor's fails, as does any other operation
// (an unrecognised selector).
enum class Op {
  kPlaceholder,
  kConstant,
  kCast,
  kMean,
  kVariance,
  kAdd,
  kSub,
  kMul,
  kRsqrt,
  kTranspose,
  kMatMul,
  kFlatten2D,
  kReshape
};

struct TensorState {
  MPSShape* shape = nil;
  MPSDataType data_type = MPSDataTypeInvalid;
  Op op = Op::kPlaceholder;
  std::vector<MPSGraphTensor*> inputs; // owned by the graph
  std::vector<int64_t> axes;
  double scalar = 0;
  ~TensorState() {
    [shape release];
  }
};

struct TensorDataState {
  id<MTLBuffer> buffer = nil;
  MPSShape* shape = nil;
  MPSDataType data_type = MPSDataTypeInvalid;
  ~TensorDataState() {
    [buffer release];
    [shape release];
  }
};

struct CompilationDescriptorState {
  MPSGraphOptimization level = MPSGraphOptimizationLevel1;
};

struct ExecutionDescriptorState {
  bool commit_and_continue = false;
  MPSGraphCompilationDescriptor* compilation = nil;
  ~ExecutionDescriptorState() {
    [compilation release];
  }
};

std::vector<int64_t> dims(MPSShape* shape) {
  std::vector<int64_t> out;
  for (NSNumber* n in shape) {
    out.push_back([n longLongValue]);
  }
  return out;
}

int64_t count(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

[[noreturn]] void unsupported(const std::string& what) {
  std::fprintf(stderr, "simulated MPSGraph: %s\n", what.c_str());
  std::abort();
}

// An IEEE 754 binary16 element, converted from a double through float with
// rounding to nearest even, as MPSGraph's casts to float16 round.
class Half {
 public:
  Half() = default;
  Half(double value) : bits_(fromFloat(static_cast<float>(value))) {}
  operator double() const {
    const int exponent = (bits_ >> 10) & 0x1f, mantissa = bits_ & 0x3ff;
    const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24)
        : exponent == 31                   ? (mantissa != 0 ? NAN : INFINITY)
                                           : std::ldexp(mantissa | 0x400, exponent - 25);
    return (bits_ & 0x8000) != 0 ? -magnitude : magnitude;
  }

 private:
  static uint16_t fromFloat(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof(x));
    const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
    x &= 0x7fffffff;
    if (x >= 0x7f800000) { // infinity, NaN
      return sign | (x > 0x7f800000 ? 0x7e00 : 0x7c00);
    }
    if (x >= 0x477ff000) { // rounds beyond 65504
      return sign | 0x7c00;
    }
    if (x < 0x38800000) { // below 2^-14: a subnormal, in units of 2^-24
      return sign | static_cast<uint16_t>(std::nearbyint(std::fabs(f) * 16777216.0f));
    }
    return sign | static_cast<uint16_t>((x - 0x38000000 + 0xfff + ((x >> 13) & 1)) >> 13);
  }
  uint16_t bits_ = 0;
};

// The element types the stand-in reads and writes.
template <typename F>
void visitElement(MPSDataType type, F&& f) {
  switch (type) {
    case MPSDataTypeInt32:
      return f(int32_t{});
    case MPSDataTypeUInt32:
      return f(uint32_t{});
    case MPSDataTypeInt64:
      return f(int64_t{});
    case MPSDataTypeFloat16:
      return f(Half{});
    case MPSDataTypeFloat32:
      return f(float{});
    default:
      unsupported("no elements of data type " + std::to_string(static_cast<unsigned>(type)));
  }
}

struct Value {
  std::vector<int64_t> shape;
  std::vector<double> data;
};

// Row-major strides of `shape` read as `to`'s trailing dimensions, 0 along
// the dimensions it broadcasts.
std::vector<int64_t> broadcastStrides(const std::vector<int64_t>& shape, const std::vector<int64_t>& to) {
  std::vector<int64_t> strides(to.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    const size_t d = shape.size() - 1 - k, o = to.size() - 1 - k;
    if (shape[d] != 1 && shape[d] != to[o]) {
      unsupported("shapes that do not broadcast");
    }
    strides[o] = shape[d] == 1 ? 0 : stride;
    stride *= shape[d];
  }
  return strides;
}

// Visits every index of `shape` with the offset of that element in each of
// `strides`.
template <typename F>
void forEach(const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& strides, F&& f) {
  std::vector<int64_t> at(shape.size(), 0);
  for (int64_t i = 0; i < count(shape); ++i) {
    std::vector<int64_t> offsets(strides.size(), 0);
    for (size_t s = 0; s < strides.size(); ++s) {
      for (size_t d = 0; d < shape.size(); ++d) {
        offsets[s] += at[d] * strides[s][d];
      }
    }
    f(i, offsets);
    for (size_t d = shape.size(); d-- > 0 && ++at[d] == shape[d];) {
      at[d] = 0;
    }
  }
}

// The shape `a` and `b` broadcast to.
std::vector<int64_t> broadcastShape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out(std::max(a.size(), b.size()), 1);
  for (size_t k = 0; k < out.size(); ++k) {
    const int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1, db = k < b.size() ? b[b.size() - 1 - k] : 1;
    out[out.size() - 1 - k] = std::max(da, db);
  }
  return out;
}

// `op` (kAdd, kSub or kMul) of `x` and `y`, broadcast.
Value binary(Op op, const Value& x, const Value& y) {
  Value out{broadcastShape(x.shape, y.shape), {}};
  out.data.resize(count(out.shape));
  forEach(out.shape,
          {broadcastStrides(x.shape, out.shape), broadcastStrides(y.shape, out.shape)},
          [&](int64_t i, const std::vector<int64_t>& o) {
            const double a = x.data[o[0]], b = y.data[o[1]];
            out.data[i] = op == Op::kAdd ? a + b : op == Op::kSub ? a - b : a * b;
          });
  return out;
}

// The matrix products of `x`'s and `y`'s two last dimensions, the others
// broadcast.
Value matmul(const Value& x, const Value& y) {
  const size_t rx = x.shape.size(), ry = y.shape.size();
  if (rx < 2 || ry < 2 || x.shape[rx - 1] != y.shape[ry - 2]) {
    unsupported("matrices whose shapes do not multiply");
  }
  const int64_t m = x.shape[rx - 2], k = x.shape[rx - 1], n = y.shape[ry - 1];
  const std::vector<int64_t> bx(x.shape.begin(), x.shape.end() - 2), by(y.shape.begin(), y.shape.end() - 2);
  const std::vector<int64_t> batch = broadcastShape(bx, by);
  Value out{batch, {}};
  out.shape.insert(out.shape.end(), {m, n});
  out.data.assign(count(out.shape), 0.0);
  forEach(batch, {broadcastStrides(bx, batch), broadcastStrides(by, batch)}, [&](int64_t b, const auto& o) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        double& z = out.data[(b * m + r) * n + c];
        for (int64_t j = 0; j < k; ++j) {
          z += x.data[(o[0] * m + r) * k + j] * y.data[(o[1] * k + j) * n + c];
        }
      }
    }
  });
  return out;
}

// A data type and, per dimension, slowest first, a length and a stride in
// elements.
struct Layout {
  MPSDataType data_type = MPSDataTypeInvalid;
  std::vector<int64_t> sizes, strides;

  // The view whose dimension i is this one's order[i].
  Layout permuted(const std::vector<size_t>& order) const {
    Layout out{data_type, {}, {}};
    for (size_t d : order) {
      out.sizes.push_back(sizes.at(d));
      out.strides.push_back(strides.at(d));
    }
    return out;
  }
};

// The layout of a packed (row-major) array of `sizes`.
Layout packedLayout(MPSDataType data_type, std::vector<int64_t> sizes) {
  std::vector<int64_t> strides = broadcastStrides(sizes, sizes);
  return {data_type, std::move(sizes), std::move(strides)};
}

// Elements of a buffer as a kernel reads or writes them: a graph's feeds
// and results (packed), an MPSNDArray (Note [simulated MPSNDArray]).
struct ArrayRef {
  sim::BufferPtr buffer;
  NSUInteger offset;
  Layout layout;

  // Visits each element, row-major over the layout's sizes; elements beyond
  // the buffer fail.
  template <typename F>
  void forEachElement(F&& f) const {
    int64_t last = 0;
    for (size_t d = 0; d < layout.sizes.size(); ++d) {
      if (layout.strides[d] < 0) {
        unsupported("a negative stride");
      }
      last += (layout.sizes[d] - 1) * layout.strides[d];
    }
    visitElement(layout.data_type, [&](auto element) {
      if (count(layout.sizes) > 0 && offset + (last + 1) * sizeof(element) > buffer->bytes()) {
        unsupported("elements beyond their buffer");
      }
      auto* base = reinterpret_cast<decltype(element)*>(static_cast<unsigned char*>(buffer->contents()) + offset);
      forEach(layout.sizes, {layout.strides}, [&](int64_t i, const std::vector<int64_t>& o) { f(i, base[o[0]]); });
    });
  }
  Value read() const {
    Value v{layout.sizes, std::vector<double>(count(layout.sizes))};
    forEachElement([&](int64_t i, auto& element) { v.data[i] = element; });
    return v;
  }
  // A result of another number of elements than its destination fails.
  void write(const Value& v) const {
    if (count(v.shape) != count(layout.sizes)) {
      unsupported("a result whose element count is not its destination's");
    }
    forEachElement([&](int64_t i, auto& element) { element = v.data[i]; });
  }
};

// A graph as the kernel evaluates it, copied from the graph's tensors when
// it is encoded: the kernel runs after the encode, when a graph that is not
// cached may be gone.
struct Program {
  struct Node {
    Op op;
    MPSDataType data_type;
    std::vector<int> inputs;
    std::vector<int64_t> axes;
    double scalar;
    std::vector<int64_t> shape; // of a constant or a reshape
  };
  std::vector<Node> nodes;
  std::map<int, ArrayRef> feeds;
  std::vector<std::pair<int, ArrayRef>> results;

  int add(MPSGraphTensor* tensor, std::map<MPSGraphTensor*, int>& index) {
    if (auto it = index.find(tensor); it != index.end()) {
      return it->second;
    }
    const auto& t = state<TensorState>(tensor);
    Node node{t.op, t.data_type, {}, t.axes, t.scalar, dims(t.shape)};
    for (MPSGraphTensor* input : t.inputs) {
      node.inputs.push_back(add(input, index));
    }
    nodes.push_back(std::move(node));
    return index[tensor] = static_cast<int>(nodes.size()) - 1;
  }

  // The mean of `x` over `axes`, shaped like `x` with those axes of size 1;
  // with `centre` (shaped like the mean), the mean of the squared
  // differences from it: the population variance.
  static Value reduce(const Value& x, std::vector<int64_t> axes, const Value* centre) {
    Value sum{x.shape, {}};
    for (int64_t& a : axes) {
      a = a < 0 ? a + static_cast<int64_t>(x.shape.size()) : a;
      sum.shape.at(a) = 1;
    }
    sum.data.assign(count(sum.shape), 0.0);
    forEach(x.shape, {broadcastStrides(sum.shape, x.shape)}, [&](int64_t i, const std::vector<int64_t>& o) {
      const double d = centre ? x.data[i] - centre->data[o[0]] : x.data[i];
      sum.data[o[0]] += centre ? d * d : d;
    });
    const double n = static_cast<double>(count(x.shape)) / static_cast<double>(count(sum.shape));
    for (double& v : sum.data) {
      v /= n;
    }
    return sum;
  }

  // Each node's value once, kept in `done` (whose elements never move).
  const Value& evaluate(int id, std::map<int, Value>& done) const {
    if (auto it = done.find(id); it != done.end()) {
      return it->second;
    }
    const Node& node = nodes[id];
    std::vector<const Value*> in;
    for (int input : node.inputs) {
      in.push_back(&evaluate(input, done));
    }
    Value out;
    switch (node.op) {
      case Op::kPlaceholder:
        if (feeds.count(id) == 0 || feeds.at(id).layout.data_type != node.data_type) {
          unsupported("a placeholder that is not fed data of its type");
        }
        out = feeds.at(id).read();
        break;
      case Op::kConstant:
        out = {node.shape, std::vector<double>(count(node.shape), node.scalar)};
        break;
      case Op::kCast:
        out = *in[0];
        visitElement(node.data_type, [&](auto element) {
          for (double& v : out.data) {
            v = static_cast<double>(static_cast<decltype(element)>(v));
          }
        });
        break;
      case Op::kMean:
        out = reduce(*in[0], node.axes, nullptr);
        break;
      case Op::kVariance:
        out = reduce(*in[0], node.axes, in[1]);
        break;
      case Op::kRsqrt:
        out = *in[0];
        for (double& v : out.data) {
          v = 1.0 / std::sqrt(v);
        }
        break;
      case Op::kAdd:
      case Op::kSub:
      case Op::kMul:
        out = binary(node.op, *in[0], *in[1]);
        break;
      case Op::kTranspose: {
        const Value& x = *in[0];
        std::vector<int64_t> strides = broadcastStrides(x.shape, x.shape);
        out.shape = x.shape;
        const auto rank = static_cast<int64_t>(x.shape.size());
        const int64_t a = (node.axes.at(0) + rank) % rank, b = (node.axes.at(1) + rank) % rank;
        std::swap(out.shape[a], out.shape[b]);
        std::swap(strides[a], strides[b]);
        out.data.resize(x.data.size());
        forEach(out.shape, {strides}, [&](int64_t i, const std::vector<int64_t>& o) { out.data[i] = x.data[o[0]]; });
        break;
      }
      case Op::kMatMul:
        out = matmul(*in[0], *in[1]);
        break;
      case Op::kFlatten2D: {
        out = *in[0];
        const auto rank = static_cast<int64_t>(out.shape.size());
        const auto axis = out.shape.begin() + (node.axes.at(0) + rank) % rank;
        out.shape = {count({out.shape.begin(), axis}), count({axis, out.shape.end()})};
        break;
      }
      case Op::kReshape:
        if (count(node.shape) != count(in[0]->shape)) {
          unsupported("a reshape to another number of elements");
        }
        out = {node.shape, in[0]->data};
        break;
    }
    return done[id] = std::move(out);
  }

  void run() const {
    std::map<int, Value> done;
    for (const auto& [id, operand] : results) {
      if (nodes[id].op == Op::kPlaceholder && feeds.count(id) == 0) {
        if (!feeds.empty()) { // a result of its own: the first feed's bytes
          const ArrayRef& in = feeds.begin()->second;
          std::memmove(
              operand.buffer->contents(), in.buffer->contents(), std::min(operand.buffer->bytes(), in.buffer->bytes()));
        }
        continue;
      }
      if (nodes[id].data_type != operand.layout.data_type) {
        unsupported("a result whose data is not of its tensor's type");
      }
      operand.write(evaluate(id, done));
    }
  }
};

// A tensor of `graph` that `op` computes from `inputs`.
MPSGraphTensor* newNode(MPSGraph* graph,
                        Op op,
                        std::vector<MPSGraphTensor*> inputs,
                        MPSDataType dataType,
                        NSArray<NSNumber*>* axes) {
  MPSGraphTensor* tensor = [graph placeholderWithShape:nil dataType:dataType name:nil];
  auto& t = state<TensorState>(tensor);
  t.op = op;
  t.inputs = std::move(inputs);
  t.axes = dims(axes);
  return tensor;
}

ArrayRef operandOf(MPSGraphTensorData* data) {
  const auto& d = state<TensorDataState>(data);
  return {sim::metal::bufferOf(d.buffer), 0, packedLayout(d.data_type, dims(d.shape))};
}

} // namespace

@implementation MPSGraphObject
@end

@implementation MPSGraphTensor
SIM_OBJC_STATE(TensorState)
SIM_OBJC_RETAIN_COUNT(TensorState)
- (id)copyWithZone:(NSZone*)zone {
  return [self retain];
}
- (MPSShape*)shape {
  return state<TensorState>(self).shape;
}
- (MPSDataType)dataType {
  return state<TensorState>(self).data_type;
}
@end

@implementation MPSGraphTensorData
SIM_OBJC_STATE(TensorDataState)
SIM_OBJC_RETAIN_COUNT(TensorDataState)
- (instancetype)initWithMTLBuffer:(id<MTLBuffer>)buffer shape:(MPSShape*)shape dataType:(MPSDataType)dataType {
  auto& s = state<TensorDataState>(self);
  s.buffer = [buffer retain];
  s.shape = [shape copy];
  s.data_type = dataType;
  return self;
}
- (MPSShape*)shape {
  return state<TensorDataState>(self).shape;
}
- (MPSDataType)dataType {
  return state<TensorDataState>(self).data_type;
}
@end

@implementation MPSGraphCompilationDescriptor
SIM_OBJC_STATE(CompilationDescriptorState)
SIM_OBJC_RETAIN_COUNT(CompilationDescriptorState)
- (id)copyWithZone:(NSZone*)zone {
  MPSGraphCompilationDescriptor* copy = [[MPSGraphCompilationDescriptor allocWithZone:zone] init];
  state<CompilationDescriptorState>(copy) = state<CompilationDescriptorState>(self);
  return copy;
}
- (MPSGraphOptimization)optimizationLevel {
  return state<CompilationDescriptorState>(self).level;
}
- (void)setOptimizationLevel:(MPSGraphOptimization)level {
  state<CompilationDescriptorState>(self).level = level;
}
@end

// MPSStream.mm declares enableCommitAndContinue in a class extension.
@interface MPSGraphExecutionDescriptor ()
@property(readwrite, atomic) BOOL enableCommitAndContinue;
@end

@implementation MPSGraphExecutionDescriptor
SIM_OBJC_STATE(ExecutionDescriptorState)
SIM_OBJC_RETAIN_COUNT(ExecutionDescriptorState)
- (BOOL)enableCommitAndContinue {
  return state<ExecutionDescriptorState>(self).commit_and_continue;
}
- (void)setEnableCommitAndContinue:(BOOL)enable {
  state<ExecutionDescriptorState>(self).commit_and_continue = enable;
}
- (MPSGraphCompilationDescriptor*)compilationDescriptor {
  return state<ExecutionDescriptorState>(self).compilation;
}
- (void)setCompilationDescriptor:(MPSGraphCompilationDescriptor*)descriptor {
  auto& s = state<ExecutionDescriptorState>(self);
  MPSGraphCompilationDescriptor* copy = [descriptor copy];
  [s.compilation release];
  s.compilation = copy;
}
@end

@implementation MPSGraph
SIM_OBJC_STATE(GraphState)
SIM_OBJC_RETAIN_COUNT(GraphState)
- (MPSGraphTensor*)placeholderWithShape:(MPSShape*)shape dataType:(MPSDataType)dataType name:(NSString*)name {
  MPSGraphTensor* tensor = [MPSGraphTensor alloc];
  state<TensorState>(tensor).shape = [shape copy];
  state<TensorState>(tensor).data_type = dataType;
  state<GraphState>(self).tensors.push_back(tensor);
  return tensor;
}
// The operations of Note [simulated MPSGraph operations].
- (MPSGraphTensor*)castTensor:(MPSGraphTensor*)tensor toType:(MPSDataType)type name:(NSString*)name {
  return newNode(self, Op::kCast, {tensor}, type, nil);
}
- (MPSGraphTensor*)constantWithScalar:(double)scalar shape:(MPSShape*)shape dataType:(MPSDataType)dataType {
  MPSGraphTensor* tensor = [self placeholderWithShape:shape dataType:dataType name:nil];
  state<TensorState>(tensor).op = Op::kConstant;
  state<TensorState>(tensor).scalar = scalar;
  return tensor;
}
- (MPSGraphTensor*)meanOfTensor:(MPSGraphTensor*)tensor axes:(NSArray<NSNumber*>*)axes name:(NSString*)name {
  return newNode(self, Op::kMean, {tensor}, tensor.dataType, axes);
}
- (MPSGraphTensor*)varianceOfTensor:(MPSGraphTensor*)tensor
                         meanTensor:(MPSGraphTensor*)meanTensor
                               axes:(NSArray<NSNumber*>*)axes
                               name:(NSString*)name {
  return newNode(self, Op::kVariance, {tensor, meanTensor}, tensor.dataType, axes);
}
- (MPSGraphTensor*)reverseSquareRootWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name {
  return newNode(self, Op::kRsqrt, {tensor}, tensor.dataType, nil);
}
- (MPSGraphTensor*)additionWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                             secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                        name:(NSString*)name {
  return newNode(self, Op::kAdd, {primaryTensor, secondaryTensor}, primaryTensor.dataType, nil);
}
- (MPSGraphTensor*)subtractionWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                           name:(NSString*)name {
  return newNode(self, Op::kSub, {primaryTensor, secondaryTensor}, primaryTensor.dataType, nil);
}
- (MPSGraphTensor*)multiplicationWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                   secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                              name:(NSString*)name {
  return newNode(self, Op::kMul, {primaryTensor, secondaryTensor}, primaryTensor.dataType, nil);
}
- (MPSGraphTensor*)transposeTensor:(MPSGraphTensor*)tensor
                         dimension:(NSUInteger)dimensionIndex
                     withDimension:(NSUInteger)dimensionIndex2
                              name:(NSString*)name {
  // NSUInteger as declared; upstream passes -1 and -2, counted from the end.
  return newNode(self,
                 Op::kTranspose,
                 {tensor},
                 tensor.dataType,
                 @[ @(static_cast<NSInteger>(dimensionIndex)), @(static_cast<NSInteger>(dimensionIndex2)) ]);
}
- (MPSGraphTensor*)matrixMultiplicationWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                         secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                                    name:(NSString*)name {
  return newNode(self, Op::kMatMul, {primaryTensor, secondaryTensor}, primaryTensor.dataType, nil);
}
- (MPSGraphTensor*)flatten2DTensor:(MPSGraphTensor*)tensor axis:(NSInteger)axis name:(NSString*)name {
  return newNode(self, Op::kFlatten2D, {tensor}, tensor.dataType, @[ @(axis) ]);
}
- (MPSGraphTensor*)reshapeTensor:(MPSGraphTensor*)tensor withShape:(MPSShape*)shape name:(NSString*)name {
  MPSGraphTensor* reshaped = newNode(self, Op::kReshape, {tensor}, tensor.dataType, nil);
  state<TensorState>(reshaped).shape = [shape copy];
  return reshaped;
}
- (void)encodeToCommandBuffer:(MPSCommandBuffer*)commandBuffer
                        feeds:(MPSGraphTensorDataDictionary*)feeds
             targetOperations:(NSArray<MPSGraphOperation*>*)targetOperations
            resultsDictionary:(MPSGraphTensorDataDictionary*)resultsDictionary
          executionDescriptor:(MPSGraphExecutionDescriptor*)executionDescriptor {
  std::atomic<int>& encoders = state<GraphState>(self).encoders;
  if (encoders.fetch_add(1) != 0) {
    std::fprintf(stderr, "simulated MPSGraph: two threads encode one MPSGraph at once\n");
    std::abort();
  }
  std::this_thread::sleep_for(kGraphEncodeTime);
  auto program = std::make_shared<Program>();
  std::map<MPSGraphTensor*, int> index;
  sim::Kernel kernel;
  for (MPSGraphTensor* tensor in feeds) {
    const ArrayRef in = operandOf([feeds objectForKey:tensor]);
    kernel.uses.emplace_back(in.buffer, sim::Access::kRead);
    program->feeds.emplace(program->add(tensor, index), in);
  }
  for (MPSGraphTensor* tensor in resultsDictionary) {
    const ArrayRef out = operandOf([resultsDictionary objectForKey:tensor]);
    kernel.uses.emplace_back(out.buffer, sim::Access::kWrite);
    program->results.emplace_back(program->add(tensor, index), out);
  }
  kernel.body = [program] { program->run(); };
  sim::CommandBufferPtr buffer = sim::metal::commandBufferOf(commandBuffer);
  sim::EncoderPtr encoder = buffer->computeEncoder();
  encoder->dispatch(std::move(kernel));
  encoder->endEncoding();
  if (executionDescriptor.enableCommitAndContinue) {
    [commandBuffer commitAndContinue];
  }
  encoders.fetch_sub(1);
}
@end

namespace {

// Note [simulated MPSNDArray]
// An MPSNDArray is a view of a buffer: a data type, a byte offset and, per
// dimension, a length and a stride in elements, listed slowest dimension
// first as PyTorch lists sizes (and as upstream passes shapes to
// descriptorWithDataType:shape: and arrayViewWithShape:strides:). Apple
// numbers dimensions from the fastest (dimension 0 is the row, whose
// elements are adjacent), so transposeDimension:i withDimension:j swaps the
// entries i and j places from the end. An array made on a buffer with a
// descriptor is packed in the descriptor's shape before its transposes; an
// array's descriptor describes the array as it is. A matrix multiplication
// treats the two fastest dimensions as rows and columns and broadcasts the
// others: D = A B, plus C with a third source (alpha and beta at their
// default, 1). No other kernel is implemented: MPSNDArrayIdentity, which
// Placeholder uses for views with a non-unit innermost stride, is there
// for the link only, and any call to it fails as an unrecognised selector.
struct NDArrayDescriptorState {
  Layout packed; // before the transposes
  std::vector<size_t> order; // dimension i is packed's order[i]
};

struct NDArrayState {
  id<MTLBuffer> buffer = nil;
  NSUInteger offset = 0;
  Layout layout;
  ~NDArrayState() {
    [buffer release];
  }
};

// A descriptor of `packed`, not transposed.
MPSNDArrayDescriptor* newDescriptor(Layout packed) {
  MPSNDArrayDescriptor* descriptor = [MPSNDArrayDescriptor alloc];
  auto& d = state<NDArrayDescriptorState>(descriptor);
  for (size_t i = 0; i < packed.sizes.size(); ++i) {
    d.order.push_back(i);
  }
  d.packed = std::move(packed);
  return [descriptor autorelease];
}

struct MatrixMultiplicationState {
  NSUInteger sources = 0;
};

// An MPSNDArray's elements, or an MPSMatrix's (which keeps the same state).
ArrayRef arrayRefOf(id array) {
  const auto& a = state<NDArrayState>(array);
  return {sim::metal::bufferOf(a.buffer), a.offset, a.layout};
}

MPSNDArray* newArrayView(MPSNDArray* array, Layout layout) {
  MPSNDArray* view = [MPSNDArray alloc];
  auto& v = state<NDArrayState>(view);
  v.buffer = [state<NDArrayState>(array).buffer retain];
  v.offset = state<NDArrayState>(array).offset;
  v.layout = std::move(layout);
  return [view autorelease];
}

} // namespace

@implementation MPSNDArrayDescriptor
SIM_OBJC_STATE(NDArrayDescriptorState)
SIM_OBJC_RETAIN_COUNT(NDArrayDescriptorState)
+ (instancetype)descriptorWithDataType:(MPSDataType)dataType shape:(MPSShape*)shape {
  return newDescriptor(packedLayout(dataType, dims(shape)));
}
// Packing is a performance hint: the layout is the same.
- (void)setPreferPackedRows:(BOOL)prefer {
}
- (void)transposeDimension:(NSUInteger)dimensionIndex withDimension:(NSUInteger)dimensionIndex2 {
  auto& order = state<NDArrayDescriptorState>(self).order;
  std::swap(order.at(order.size() - 1 - dimensionIndex), order.at(order.size() - 1 - dimensionIndex2));
}
@end

@implementation MPSNDArray
SIM_OBJC_STATE(NDArrayState)
SIM_OBJC_RETAIN_COUNT(NDArrayState)
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer
                        offset:(NSUInteger)offset
                    descriptor:(MPSNDArrayDescriptor*)descriptor {
  auto& a = state<NDArrayState>(self);
  const auto& d = state<NDArrayDescriptorState>(descriptor);
  a.buffer = [buffer retain];
  a.offset = offset;
  a.layout = d.packed.permuted(d.order);
  return self;
}
- (NSUInteger)numberOfDimensions {
  return state<NDArrayState>(self).layout.sizes.size();
}
- (MPSNDArrayDescriptor*)descriptor {
  const Layout& layout = state<NDArrayState>(self).layout;
  return newDescriptor(packedLayout(layout.data_type, layout.sizes));
}
- (MPSNDArray*)arrayViewWithCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                               descriptor:(MPSNDArrayDescriptor*)descriptor
                                 aliasing:(MPSAliasingStrategy)aliasing {
  const Layout& layout = state<NDArrayState>(self).layout;
  const auto& d = state<NDArrayDescriptorState>(descriptor);
  if (d.packed.sizes != layout.sizes || d.packed.data_type != layout.data_type) {
    unsupported("an array view whose descriptor is not its array's, transposed");
  }
  return newArrayView(self, layout.permuted(d.order));
}
- (MPSNDArray*)arrayViewWithShape:(MPSShape*)shape strides:(MPSShape*)strides {
  return newArrayView(self, {state<NDArrayState>(self).layout.data_type, dims(shape), dims(strides)});
}
@end

@implementation MPSNDArrayMatrixMultiplication
SIM_OBJC_STATE(MatrixMultiplicationState)
SIM_OBJC_RETAIN_COUNT(MatrixMultiplicationState)
- (instancetype)initWithDevice:(id<MTLDevice>)device sourceCount:(NSUInteger)count {
  if (count != 2 && count != 3) {
    unsupported("a matrix multiplication of other than 2 or 3 sources");
  }
  state<MatrixMultiplicationState>(self).sources = count;
  return self;
}
- (void)encodeToCommandEncoder:(id<MTLComputeCommandEncoder>)encoder
                 commandBuffer:(id<MTLCommandBuffer>)commandBuffer
                  sourceArrays:(NSArray<MPSNDArray*>*)sourceArrays
              destinationArray:(MPSNDArray*)destination {
  if (sourceArrays.count != state<MatrixMultiplicationState>(self).sources) {
    unsupported("a matrix multiplication given another number of sources than it was made for");
  }
  sim::Kernel kernel;
  std::vector<ArrayRef> sources;
  for (MPSNDArray* source in sourceArrays) {
    sources.push_back(arrayRefOf(source));
    kernel.uses.emplace_back(sources.back().buffer, sim::Access::kRead);
  }
  const ArrayRef result = arrayRefOf(destination);
  kernel.uses.emplace_back(result.buffer, sim::Access::kWrite);
  kernel.body = [sources, result] {
    Value d = matmul(sources[0].read(), sources[1].read());
    if (sources.size() == 3) {
      d = binary(Op::kAdd, d, sources[2].read());
    }
    result.write(d);
  };
  sim::metal::dispatchKernel(encoder, std::move(kernel));
}
@end

namespace {

// Note [simulated MPSMatrix]
// An MPSMatrix is `matrices` row-major matrices of a buffer, from a byte
// offset, rowBytes and matrixBytes apart. MPSMatrixSolveTriangular solves
// op(A) X = alpha B for each matrix, with A on the left (the only side
// implemented) and op(A) = A or its transpose, in double precision; it
// encodes its own compute pass into the command buffer, reading A and B and
// writing X, as Apple's kernels do. MPSMatrixDecompositionLU factors each
// matrix with partial pivoting as LAPACK's getrf does: L (unit diagonal) and
// U overwrite the result, pivot k (uint32, from 0) is the row swapped with
// row k, and the status buffer's int32 is 0, or -2 (singular) for a zero
// pivot. MPSMatrixSolveLU solves A X = B from those factors and pivots.
struct MatrixDescriptorState {
  Layout layout; // matrices, rows, columns
};

struct SolveTriangularState {
  bool upper = false, transpose = false, unit = false;
  double alpha = 1.0;
};

// Solves op(A) X = alpha B for every matrix of A (n x n) and B (n x k).
Value solveTriangular(const Value& a, const Value& b, const SolveTriangularState& how) {
  const int64_t n = a.shape[1], k = b.shape[2];
  const bool upper = how.upper != how.transpose; // of op(A)
  auto op = [&](int64_t m, int64_t r, int64_t c) {
    return how.transpose ? a.data[(m * n + c) * n + r] : a.data[(m * n + r) * n + c];
  };
  Value x{b.shape, std::vector<double>(b.data.size())};
  for (int64_t m = 0; m < a.shape[0]; ++m) {
    for (int64_t step = 0; step < n; ++step) {
      const int64_t r = upper ? n - 1 - step : step;
      for (int64_t c = 0; c < k; ++c) {
        double sum = how.alpha * b.data[(m * n + r) * k + c];
        for (int64_t j = upper ? r + 1 : 0; j < (upper ? n : r); ++j) {
          sum -= op(m, r, j) * x.data[(m * n + j) * k + c];
        }
        x.data[(m * n + r) * k + c] = how.unit ? sum : sum / op(m, r, r);
      }
    }
  }
  return x;
}

// Factors every matrix of `a` (r x c) in place; returns the pivots, one row
// of min(r, c) per matrix, and each matrix's status.
std::pair<Value, std::vector<int32_t>> factorLU(Value& a) {
  const int64_t matrices = a.shape[0], rows = a.shape[1], cols = a.shape[2], steps = std::min(rows, cols);
  Value pivots{{matrices, 1, steps}, std::vector<double>(matrices * steps)};
  std::vector<int32_t> status(matrices, 0);
  for (int64_t m = 0; m < matrices; ++m) {
    auto at = [&](int64_t r, int64_t c) -> double& { return a.data[(m * rows + r) * cols + c]; };
    for (int64_t k = 0; k < steps; ++k) {
      int64_t pivot = k;
      for (int64_t r = k + 1; r < rows; ++r) {
        pivot = std::abs(at(r, k)) > std::abs(at(pivot, k)) ? r : pivot;
      }
      pivots.data[m * steps + k] = static_cast<double>(pivot);
      for (int64_t c = 0; c < cols; ++c) {
        std::swap(at(k, c), at(pivot, c));
      }
      if (at(k, k) == 0) {
        status[m] = -2;
        continue;
      }
      for (int64_t r = k + 1; r < rows; ++r) {
        at(r, k) /= at(k, k);
        for (int64_t c = k + 1; c < cols; ++c) {
          at(r, c) -= at(r, k) * at(k, c);
        }
      }
    }
  }
  return {pivots, status};
}

// Solves A X = B for every matrix, from A's factors `lu` (n x n) and pivots.
Value solveLU(const Value& lu, const Value& pivots, const Value& b) {
  const int64_t n = lu.shape[1], k = b.shape[2];
  Value x = b;
  for (int64_t m = 0; m < lu.shape[0]; ++m) {
    auto l = [&](int64_t r, int64_t c) { return lu.data[(m * n + r) * n + c]; };
    auto at = [&](int64_t r, int64_t c) -> double& { return x.data[(m * n + r) * k + c]; };
    for (int64_t r = 0; r < n; ++r) {
      const auto pivot = static_cast<int64_t>(pivots.data[m * n + r]);
      for (int64_t c = 0; c < k; ++c) {
        std::swap(at(r, c), at(pivot, c));
      }
    }
    for (int64_t c = 0; c < k; ++c) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < r; ++j) {
          at(r, c) -= l(r, j) * at(j, c);
        }
      }
      for (int64_t r = n - 1; r >= 0; --r) {
        for (int64_t j = r + 1; j < n; ++j) {
          at(r, c) -= l(r, j) * at(j, c);
        }
        at(r, c) /= l(r, r);
      }
    }
  }
  return x;
}

// A kernel of Apple's, in a compute pass of its own on `commandBuffer`.
void encodeOwnPass(id<MTLCommandBuffer> commandBuffer, sim::Kernel kernel) {
  id<MTLComputeCommandEncoder> encoder = [commandBuffer computeCommandEncoder];
  sim::metal::dispatchKernel(encoder, std::move(kernel));
  [encoder endEncoding];
}

} // namespace

@implementation MPSMatrixDescriptor
SIM_OBJC_STATE(MatrixDescriptorState)
SIM_OBJC_RETAIN_COUNT(MatrixDescriptorState)
+ (MPSMatrixDescriptor*)matrixDescriptorWithRows:(NSUInteger)rows
                                         columns:(NSUInteger)columns
                                        rowBytes:(NSUInteger)rowBytes
                                        dataType:(MPSDataType)dataType {
  return [self matrixDescriptorWithRows:rows
                                columns:columns
                               matrices:1
                               rowBytes:rowBytes
                            matrixBytes:rows * rowBytes
                               dataType:dataType];
}
+ (MPSMatrixDescriptor*)matrixDescriptorWithRows:(NSUInteger)rows
                                         columns:(NSUInteger)columns
                                        matrices:(NSUInteger)matrices
                                        rowBytes:(NSUInteger)rowBytes
                                     matrixBytes:(NSUInteger)matrixBytes
                                        dataType:(MPSDataType)dataType {
  size_t element = 0;
  visitElement(dataType, [&](auto e) { element = sizeof(e); });
  if (rowBytes % element != 0 || matrixBytes % element != 0) {
    unsupported("a matrix whose rows or matrices are not a whole number of elements apart");
  }
  MPSMatrixDescriptor* descriptor = [[MPSMatrixDescriptor alloc] autorelease];
  state<MatrixDescriptorState>(descriptor).layout = {
      dataType,
      {static_cast<int64_t>(matrices), static_cast<int64_t>(rows), static_cast<int64_t>(columns)},
      {static_cast<int64_t>(matrixBytes / element), static_cast<int64_t>(rowBytes / element), 1}};
  return descriptor;
}
@end

@implementation MPSMatrix
SIM_OBJC_STATE(NDArrayState)
SIM_OBJC_RETAIN_COUNT(NDArrayState)
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer descriptor:(MPSMatrixDescriptor*)descriptor {
  return [self initWithBuffer:buffer offset:0 descriptor:descriptor];
}
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer
                        offset:(NSUInteger)offset
                    descriptor:(MPSMatrixDescriptor*)descriptor {
  auto& m = state<NDArrayState>(self);
  m.buffer = [buffer retain];
  m.offset = offset;
  m.layout = state<MatrixDescriptorState>(descriptor).layout;
  return self;
}
@end

@implementation MPSMatrixSolveTriangular
SIM_OBJC_STATE(SolveTriangularState)
SIM_OBJC_RETAIN_COUNT(SolveTriangularState)
- (instancetype)initWithDevice:(id<MTLDevice>)device
                         right:(BOOL)right
                         upper:(BOOL)upper
                     transpose:(BOOL)transpose
                          unit:(BOOL)unit
                         order:(NSUInteger)order
        numberOfRightHandSides:(NSUInteger)numberOfRightHandSides
                         alpha:(double)alpha {
  if (right) {
    unsupported("a triangular solve with A on the right");
  }
  state<SolveTriangularState>(self) = {
      static_cast<bool>(upper), static_cast<bool>(transpose), static_cast<bool>(unit), alpha};
  return self;
}
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)commandBuffer
                 sourceMatrix:(MPSMatrix*)sourceMatrix
          rightHandSideMatrix:(MPSMatrix*)rightHandSideMatrix
               solutionMatrix:(MPSMatrix*)solutionMatrix {
  const ArrayRef a = arrayRefOf(sourceMatrix), b = arrayRefOf(rightHandSideMatrix), x = arrayRefOf(solutionMatrix);
  sim::Kernel kernel;
  kernel.uses = {{a.buffer, sim::Access::kRead}, {b.buffer, sim::Access::kRead}, {x.buffer, sim::Access::kWrite}};
  kernel.body = [a, b, x, how = state<SolveTriangularState>(self)] {
    x.write(solveTriangular(a.read(), b.read(), how));
  };
  encodeOwnPass(commandBuffer, std::move(kernel));
}
@end

@implementation MPSMatrixDecompositionLU
SIM_OBJC_STATE(Stateless)
SIM_OBJC_RETAIN_COUNT(Stateless)
- (instancetype)initWithDevice:(id<MTLDevice>)device rows:(NSUInteger)rows columns:(NSUInteger)columns {
  return self;
}
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)commandBuffer
                 sourceMatrix:(MPSMatrix*)sourceMatrix
                 resultMatrix:(MPSMatrix*)resultMatrix
                 pivotIndices:(MPSMatrix*)pivotIndices
                       status:(id<MTLBuffer>)status {
  const ArrayRef a = arrayRefOf(sourceMatrix), lu = arrayRefOf(resultMatrix), p = arrayRefOf(pivotIndices);
  const sim::BufferPtr s = sim::metal::bufferOf(status);
  sim::Kernel kernel;
  kernel.uses = {{lu.buffer, sim::Access::kWrite}, {p.buffer, sim::Access::kWrite}, {s, sim::Access::kWrite}};
  if (a.buffer != lu.buffer) {
    kernel.uses.emplace_back(a.buffer, sim::Access::kRead);
  }
  kernel.body = [a, lu, p, s] {
    Value factors = a.read();
    const auto [pivots, statuses] = factorLU(factors);
    lu.write(factors);
    p.write(pivots);
    std::memcpy(s->contents(), statuses.data(), statuses.size() * sizeof(int32_t));
  };
  encodeOwnPass(commandBuffer, std::move(kernel));
}
@end

@implementation MPSMatrixSolveLU
SIM_OBJC_STATE(Stateless)
SIM_OBJC_RETAIN_COUNT(Stateless)
- (instancetype)initWithDevice:(id<MTLDevice>)device
                     transpose:(BOOL)transpose
                         order:(NSUInteger)order
        numberOfRightHandSides:(NSUInteger)numberOfRightHandSides {
  if (transpose) {
    unsupported("an LU solve with A transposed");
  }
  return self;
}
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)commandBuffer
                 sourceMatrix:(MPSMatrix*)sourceMatrix
          rightHandSideMatrix:(MPSMatrix*)rightHandSideMatrix
                 pivotIndices:(MPSMatrix*)pivotIndices
               solutionMatrix:(MPSMatrix*)solutionMatrix {
  const ArrayRef lu = arrayRefOf(sourceMatrix), b = arrayRefOf(rightHandSideMatrix), p = arrayRefOf(pivotIndices);
  const ArrayRef x = arrayRefOf(solutionMatrix);
  sim::Kernel kernel;
  kernel.uses = {{lu.buffer, sim::Access::kRead},
                 {b.buffer, sim::Access::kRead},
                 {p.buffer, sim::Access::kRead},
                 {x.buffer, sim::Access::kWrite}};
  kernel.body = [lu, b, p, x] { x.write(solveLU(lu.read(), p.read(), b.read())); };
  encodeOwnPass(commandBuffer, std::move(kernel));
}
@end

// For the link only (Note [simulated MPSNDArray]).
#define SIM_LINK_ONLY_CLASS(name)  \
  @implementation name             \
  SIM_OBJC_STATE(Stateless)        \
  SIM_OBJC_RETAIN_COUNT(Stateless) \
  @end
SIM_LINK_ONLY_CLASS(MPSKernel)
SIM_LINK_ONLY_CLASS(MPSMatrixBinaryKernel)
SIM_LINK_ONLY_CLASS(MPSMatrixUnaryKernel)
SIM_LINK_ONLY_CLASS(MPSNDArrayMultiaryBase)
SIM_LINK_ONLY_CLASS(MPSNDArrayMultiaryKernel)
SIM_LINK_ONLY_CLASS(MPSNDArrayUnaryKernel)
SIM_LINK_ONLY_CLASS(MPSNDArrayIdentity)
#undef SIM_LINK_ONLY_CLASS
