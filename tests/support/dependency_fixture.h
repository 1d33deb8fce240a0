#pragma once

// Fixture of the cross-stream dependency tests: simulated streams registered
// with a DependencyTracker, and ops that compute on one-word tensors so that
// a missing dependency shows up as a wrong value.

#include "SimStream.h"
#include "harness.h"

#include <ATen/mps/MPSStreamDependencies.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace harness {

struct Tensor {
  sim::BufferPtr buf;
  at::mps::BufferUses uses{0, nullptr}; // no table (ids start at 1)
};

// Bounds every wait of a dependency test; it fires only on a hang.
constexpr auto kDeadline = std::chrono::seconds(60);

class DependencyTest : public SimTest {
 protected:
  explicit DependencyTest(sim::Config config = latency())
      : SimTest(std::move(config)) {}
  static sim::Config latency() {
    sim::Config c;
    c.seed = 7;
    c.min_latency = std::chrono::microseconds(100);
    c.max_latency = std::chrono::microseconds(800);
    c.reorder_completions = 0.2;
    // Generous: on a loaded 2-core machine a producer's flush can be slow,
    // and a GPU wait that times out fails the test with a clear error.
    c.event_wait_timeout = std::chrono::milliseconds(30000);
    return c;
  }
  void SetUp() override {
    SimTest::SetUp();
    tracker_ = std::make_unique<at::mps::DependencyTracker>();
  }
  // Waits until stream `s` was asked to commit: the asking stream has
  // recorded its op by then. Tests wait for the request itself, never for a
  // fixed time, so that a loaded machine cannot make them fail.
  static void waitForFlushRequest(sim::SimStream& s) {
    const auto end = std::chrono::steady_clock::now() + kDeadline;
    while (s.flushRequests() == 0) {
      ASSERT_LT(std::chrono::steady_clock::now(), end)
          << "no stream asked stream " << s.index() << " to commit";
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  void makeStreams(int n) {
    for (int i = 0; i < n; ++i) {
      streams_.push_back(std::make_unique<sim::SimStream>(
          device().newCommandQueue(), i, i == 0));
      tracker_->registerStream(*streams_.back());
    }
  }
  void releaseResources() override {
    for (auto& s : streams_) {
      s->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    }
    streams_.clear();
  }
  std::unique_ptr<Tensor> tensor(int64_t value = 0) {
    auto t = std::make_unique<Tensor>();
    t->buf = device().newBuffer(1);
    t->buf->write(0, value);
    return t;
  }
  sim::SimStream& stream(int i) {
    return *streams_[i];
  }
  // One buffer's use, through the tracker.
  void use(
      at::mps::DependencyStream& s,
      at::mps::BufferUses& buffer,
      at::mps::Access access,
      at::mps::UseSite site) {
    const at::mps::DependencyTracker::Use one{&buffer, access};
    tracker_->use(s, one, site);
  }
  // The tracker's waits over all streams, by kind (sim::SimStream::Waits).
  uint64_t waits(std::atomic<uint64_t> sim::SimStream::Waits::*kind) const {
    uint64_t n = 0;
    for (const auto& s : streams_) {
      n += (s->waits().*kind).load();
    }
    return n;
  }
  uint64_t gpuWaits() const {
    return waits(&sim::SimStream::Waits::gpu);
  }
  uint64_t cpuWaits() const {
    return waits(&sim::SimStream::Waits::cpu);
  }
  uint64_t commitWaits() const {
    return waits(&sim::SimStream::Waits::commit);
  }

  // For the in-pass hook tests: one pass on stream 0 that makes the hook
  // calls `hooks` with its encoder open, writes `value` to `x`, and ends
  // with `sync`.
  void writeInPassOnStream0(
      const Tensor& x,
      int64_t value,
      at::mps::SyncType sync,
      const std::function<void()>& hooks) {
    stream(0).serial([&](sim::Lifecycle& lc) {
      sim::EncoderPtr enc = lc.commandEncoder();
      hooks();
      enc->dispatch({{{x.buf, sim::Access::kWrite}}, [b = x.buf, value] {
                       b->write(0, value);
                     }});
      lc.synchronize(sync);
    });
  }

  // For the in-pass hook tests, after stream 0 wrote `x` with its queue
  // paused: reads `x` on stream 1 after a kBeforeEncoding use of `uses`,
  // resumes stream 0, and returns the value the GPU read saw.
  int64_t readOnStream1(const Tensor& x, at::mps::BufferUses& uses) {
    std::atomic<int64_t> seen{-1};
    stream(1).serial([&](sim::Lifecycle& lc) {
      use(stream(1),
          uses,
          at::mps::Access::kRead,
          at::mps::UseSite::kBeforeEncoding);
      lc.commandEncoder()->dispatch(
          {{{x.buf, sim::Access::kRead}},
           [b = x.buf, &seen] { seen = b->read(0); }});
      lc.synchronize(at::mps::SyncType::COMMIT);
    });
    stream(0).queue().resume();
    stream(1).synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    return seen.load();
  }

  // An op on `s`: out = combine(inputs), on the GPU. With `track`, uses go
  // through the tracker at `site` first.
  void op(
      sim::SimStream& s,
      std::vector<Tensor*> inputs,
      Tensor* out,
      int64_t salt,
      at::mps::SyncType sync = at::mps::SyncType::NONE,
      at::mps::UseSite site = at::mps::UseSite::kBeforeEncoding,
      bool track = true) {
    s.serial([&](sim::Lifecycle& lc) {
      sim::EncoderPtr enc;
      if (site == at::mps::UseSite::kInPass) {
        enc = lc.commandEncoder(); // the op holds an encoder first
      }
      if (track) {
        std::vector<at::mps::DependencyTracker::Use> uses;
        for (Tensor* in : inputs) {
          uses.push_back({&in->uses, at::mps::Access::kRead});
        }
        uses.push_back({&out->uses, at::mps::Access::kWrite});
        tracker_->use(s, uses, site);
      }
      if (!enc) {
        enc = lc.commandEncoder();
      }
      sim::Kernel k;
      std::vector<sim::BufferPtr> ins;
      for (Tensor* in : inputs) {
        k.uses.push_back({in->buf, sim::Access::kRead});
        ins.push_back(in->buf);
      }
      k.uses.push_back({out->buf, sim::Access::kWrite});
      k.body = [ins, o = out->buf, salt] { o->write(0, combine(ins, salt)); };
      enc->dispatch(std::move(k));
      lc.synchronize(sync);
    });
  }
  // Unsigned, so that the hash wraps instead of overflowing.
  static uint64_t mix(uint64_t v, int64_t x) {
    return v * 1000003u + static_cast<uint64_t>(x);
  }
  static int64_t combine(const std::vector<sim::BufferPtr>& ins, int64_t salt) {
    uint64_t v = static_cast<uint64_t>(salt);
    for (auto& b : ins) {
      v = mix(v, b->read(0));
    }
    return static_cast<int64_t>(v);
  }
  // Reads on the host as .cpu()/.item() do: a copy on `reader`'s stream,
  // ordered after the producer of `t`, then a wait for `reader` alone.
  int64_t hostRead(sim::SimStream& reader, Tensor& t) {
    reader.serial([&](sim::Lifecycle& lc) {
      use(reader,
          t.uses,
          at::mps::Access::kRead,
          at::mps::UseSite::kBeforeEncoding);
      lc.commandEncoder()->dispatch({{{t.buf, sim::Access::kRead}}, nullptr});
      lc.synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
    });
    return t.buf->read(0);
  }

  std::unique_ptr<at::mps::DependencyTracker> tracker_;
  std::vector<std::unique_ptr<sim::SimStream>> streams_;
};

} // namespace harness
