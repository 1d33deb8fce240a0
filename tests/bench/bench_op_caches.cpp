// Costs of the op-level thread-safety pieces on their hot paths, each next to
// the v2.9.1 model it replaces where there is one.

#include <benchmark/benchmark.h>

#include <ATen/mps/MPSFrameworkWorkarounds.h>
#include <ATen/mps/MPSObjectCache.h>
#include <ATen/mps/MPSSerialDispatch.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr int kKeys = 256;

// Keys shaped like MPSGraphCache keys.
const std::vector<std::string>& keys() {
  static const auto* k = [] {
    auto* v = new std::vector<std::string>();
    for (int i = 0; i < kKeys; ++i) {
      v->push_back(
          "mps_linear:f32[4,16," + std::to_string(i) +
          "]:f32[128,256]:f32[128]:Contiguous");
    }
    return v;
  }();
  return *k;
}

struct Object {
  int payload = 0;
};
const void* identityOf(const std::unique_ptr<Object>& o) {
  return o.get();
}

at::mps::OnceCache<std::string, int>* const once_cache = [] {
  auto* c = new at::mps::OnceCache<std::string, int>();
  for (int i = 0; i < kKeys; ++i) {
    c->getOrCreate(keys()[i], [i] { return i; });
  }
  return c;
}();

at::mps::ObjectCache<std::unique_ptr<Object>>* const object_cache = [] {
  auto* c = new at::mps::ObjectCache<std::unique_ptr<Object>>(&identityOf);
  for (int i = 0; i < kKeys; ++i) {
    c->getOrCreate(keys()[i], [] { return std::make_unique<Object>(); });
  }
  return c;
}();

// v2.9.1 MetalShaderLibrary::cplMap: an unsynchronised map (racy).
std::unordered_map<std::string, int>* const plain_map = [] {
  auto* m = new std::unordered_map<std::string, int>();
  for (int i = 0; i < kKeys; ++i) {
    (*m)[keys()[i]] = i;
  }
  return m;
}();
// v2.9.1 MPSGraphCache::LookUp: the same map behind a serial dispatch queue,
// modelled (cheaper than dispatch_sync) by one process-wide mutex.
std::mutex* const serial_mu = new std::mutex();

void BM_V291_UnsynchronisedMapHit(benchmark::State& state) {
  int i = state.thread_index();
  for (auto _ : state) {
    benchmark::DoNotOptimize(plain_map->find(keys()[i++ % kKeys]));
  }
}
BENCHMARK(BM_V291_UnsynchronisedMapHit)->Threads(1)->Threads(2);

void BM_V291_SerialisedMapHit(benchmark::State& state) {
  int i = state.thread_index();
  for (auto _ : state) {
    std::lock_guard<std::mutex> lock(*serial_mu);
    benchmark::DoNotOptimize(plain_map->find(keys()[i++ % kKeys]));
  }
}
BENCHMARK(BM_V291_SerialisedMapHit)->Threads(1)->Threads(2);

// MetalShaderLibrary library/pipeline lookups.
void BM_OnceCacheHit(benchmark::State& state) {
  int i = state.thread_index();
  for (auto _ : state) {
    benchmark::DoNotOptimize(once_cache->find(keys()[i++ % kKeys]));
  }
}
BENCHMARK(BM_OnceCacheHit)->Threads(1)->Threads(2);

// What a cached graph op adds: the lookup by key (LookUpOrCreateCachedGraph)
// and the encode guard by identity (runMPSGraph).
void BM_GraphCacheLookupAndEncodeGuard(benchmark::State& state) {
  int i = state.thread_index() * 7;
  for (auto _ : state) {
    auto* entry = object_cache->find(keys()[i++ % kKeys]);
    at::mps::EncodeGuard guard = object_cache->encodeGuard(entry->get());
    benchmark::DoNotOptimize((*entry)->payload);
  }
}
BENCHMARK(BM_GraphCacheLookupAndEncodeGuard)->Threads(1)->Threads(2);

// The "more than one stream active" decision of Linear and LayerNorm.
void BM_PreferGraphPathDecision(benchmark::State& state) {
  auto& activity = at::mps::streamActivity();
  const auto index = static_cast<at::mps::StreamIndex>(state.thread_index());
  for (auto _ : state) {
    benchmark::DoNotOptimize(at::mps::preferGraphPath(false, activity, index));
  }
}
BENCHMARK(BM_PreferGraphPathDecision)->Threads(1)->Threads(2);

void BM_StreamActivityNote(benchmark::State& state) {
  auto& activity = at::mps::streamActivity();
  const auto index = static_cast<at::mps::StreamIndex>(state.thread_index());
  for (auto _ : state) {
    activity.noteEncoding(index);
  }
}
BENCHMARK(BM_StreamActivityNote)->Threads(1)->Threads(2);

at::mps::EncoderLifecycleGate* const gate_off =
    new at::mps::EncoderLifecycleGate(false);
at::mps::EncoderLifecycleGate* const gate_on =
    new at::mps::EncoderLifecycleGate(true);

void BM_EncoderGateOff(benchmark::State& state) {
  int n = 0;
  for (auto _ : state) {
    gate_off->run([&] { benchmark::DoNotOptimize(++n); });
  }
}
BENCHMARK(BM_EncoderGateOff);

void BM_EncoderGateOnUncontended(benchmark::State& state) {
  int n = 0;
  for (auto _ : state) {
    gate_on->run([&] { benchmark::DoNotOptimize(++n); });
  }
}
BENCHMARK(BM_EncoderGateOnUncontended);

void BM_SerializedEncodeUncontended(benchmark::State& state) {
  for (auto _ : state) {
    at::mps::SerializedEncode lock(
        at::mps::RacyKernelFamily::kMatrixMultiplication);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_SerializedEncodeUncontended);

// dispatch_sync_with_rethrow: a dispatch (queue modelled by a mutex) and an
// inline re-entry.
std::mutex* const queue_mu = new std::mutex();
void dispatchOnMutexQueue(void* ctx, void (*work)(void*)) {
  std::lock_guard<std::mutex> lock(*queue_mu);
  work(ctx);
}

void BM_DispatchSyncWithRethrow(benchmark::State& state) {
  int n = 0;
  for (auto _ : state) {
    at::mps::dispatchSyncWithRethrow(
        queue_mu, dispatchOnMutexQueue, [&] { benchmark::DoNotOptimize(++n); });
  }
}
BENCHMARK(BM_DispatchSyncWithRethrow);

void BM_DispatchSyncWithRethrowReentry(benchmark::State& state) {
  int n = 0;
  at::mps::SerialSection section(queue_mu, at::mps::SerialSection::innermost());
  for (auto _ : state) {
    at::mps::dispatchSyncWithRethrow(
        queue_mu, dispatchOnMutexQueue, [&] { benchmark::DoNotOptimize(++n); });
  }
}
BENCHMARK(BM_DispatchSyncWithRethrowReentry);

} // namespace
