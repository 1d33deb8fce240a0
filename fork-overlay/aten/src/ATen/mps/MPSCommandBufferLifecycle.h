#pragma once

#include <ATen/mps/MPSStreamPool.h>

#include <map>
#include <set>
#include <string>

namespace at::mps {

enum class SyncType {
  NONE, // no commit to command buffer
  COMMIT, // commit and flush the command buffer
  COMMIT_AND_WAIT, // flush and wait for command buffer execution to finish
  COMMIT_AND_CONTINUE, // commit and continue with a new underlying buffer
  COMMIT_ADAPTIVE, // commit adaptively based on available memory
};

struct CompletionStatus {
  bool ok = true;
  std::string error; // set when !ok
};
using CompletionHandler = std::function<void(const CompletionStatus&)>;

constexpr EnvSwitch kCommitAndContinueSwitch{
    "MPS_ENABLE_COMMIT_AND_CONTINUE",
    "commitAndContinue on every stream",
    "off on every stream",
    "on for the default stream only"};

// On for the default stream only, unless `env_value` says otherwise (see
// Note [MPS environment switches]); MPSStream turns it off for the profiler.
inline bool resolveCommitAndContinue(StreamIndex index, const char* env_value) {
  return parseEnvSwitch(kCommitAndContinueSwitch, env_value)
      .value_or(index == kDefaultStreamIndex);
}

// Note [MPS command buffer lifecycle]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A stream has at most one open command buffer, with at most one open
// compute encoder, both made lazily. Transitions happen under `mu_`, so
// concurrent callers never commit a buffer twice, encode into a committed
// one or end an encoder another call just made; code keeping the buffer or
// encoder across calls runs in the serial section, as every MPS op does.
//
// Each commit point (a commit, or commitAndContinue of an existing buffer)
// takes the next timeline value, reported by a completion handler added
// before the commit; the completed value is the largest n with points 1..n
// done, so completion may come out of order. COMMIT_AND_WAIT waits for a
// timeline value, never a buffer (nor commitAndContinue's uncommitted root),
// and without `mu_`, so completion handlers cannot deadlock against a
// waiter; they must not enter the serial section, where a waiter may sit.
//
// addCompletedHandler(h) runs h once all work submitted so far completes: it
// joins the open buffer if that has work, else waits for the last commit
// point, or runs at once. No empty buffer is made, none committed clean.
//
// A pass that carried work ends (with its encoder, or at a commit) with a
// GPU signal of the stream's timeline event at the next pass mark, awaited
// by other streams (Note [MPS cross-stream dependencies]).
//
// Ops provides copyable handles Queue, Buffer and Encoder (the caller owns
// what make*() returns) and:
//   Buffer makeBuffer(const Queue&); Encoder makeComputeEncoder(Buffer);
//   void endEncoding(Encoder); void commit(Buffer); each releases its handle
//   void commitAndContinue(Buffer);             commits the root, stays open
//   void addCompletedHandler(Buffer, CompletionHandler);  on the open root
//   void signalTimeline(Buffer, uint64_t mark); no encoder open
//   bool lowWatermarkReached();                 for COMMIT_ADAPTIVE
template <typename Ops>
class CommandBufferLifecycle {
 public:
  using Queue = typename Ops::Queue;
  using Buffer = typename Ops::Buffer;
  using Encoder = typename Ops::Encoder;

  CommandBufferLifecycle(Ops ops, Queue queue, bool commit_and_continue)
      : ops_(std::move(ops)),
        queue_(std::move(queue)),
        commit_and_continue_(commit_and_continue) {}

  // Commits what is left (even a clean buffer that commitAndContinue kept
  // open) and waits, so no completion handler outlives the object.
  ~CommandBufferLifecycle() {
    {
      MutexLock lock(mu_);
      dirty_ = true;
    }
    synchronize(SyncType::COMMIT_AND_WAIT);
  }

  Buffer commandBuffer() MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return markPassUsed();
  }

  Encoder commandEncoder() MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    markPassUsed();
    if (!has_encoder_) {
      encoder_ = ops_.makeComputeEncoder(buffer_);
      has_encoder_ = true;
    }
    return encoder_;
  }

  // `signal_if_empty`: signal the pass's mark even if the pass is empty
  // (Note [MPS cross-stream dependencies] says why).
  void endKernelCoalescing(bool signal_if_empty = false) MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (signal_if_empty) {
      markPassUsed();
    }
    endEncoder();
  }

  // DependencyStream::flushAsync()'s work, in the serial section.
  void commitThrough(uint64_t mark) MPS_EXCLUDES(mu_, timeline_mu_) {
    MutexLock lock(mu_);
    if (open_mark_.load(std::memory_order_relaxed) <= mark) {
      markPassUsed();
    }
    endEncoder();
    commitOpen(commit_and_continue_);
  }

  void synchronize(SyncType sync_type) MPS_EXCLUDES(mu_, timeline_mu_) {
    uint64_t wait_for = 0;
    {
      MutexLock lock(mu_);
      endEncoder();
      switch (sync_type) {
        case SyncType::NONE:
          return;
        case SyncType::COMMIT_ADAPTIVE:
        case SyncType::COMMIT:
          if (sync_type == SyncType::COMMIT || ops_.lowWatermarkReached()) {
            commitOpen(commit_and_continue_);
          }
          return;
        case SyncType::COMMIT_AND_CONTINUE:
          TORCH_INTERNAL_ASSERT(
              commit_and_continue_,
              "COMMIT_AND_CONTINUE requested on a stream that has "
              "commitAndContinue disabled");
          commitOpen(/*keep_open=*/true);
          return;
        case SyncType::COMMIT_AND_WAIT:
          // A plain commit; see Note [MPS command buffer lifecycle].
          commitOpen(/*keep_open=*/false);
          wait_for = lastCommitPoint();
          break;
      }
    }
    waitForCommitPoint(wait_for);
  }

  void addCompletedHandler(CompletionHandler handler)
      MPS_EXCLUDES(mu_, timeline_mu_) {
    uint64_t submitted = 0;
    {
      MutexLock lock(mu_);
      if (dirty_) {
        ops_.addCompletedHandler(buffer_, std::move(handler));
        return;
      }
      submitted = lastCommitPoint();
    }
    addTimelineHandler(submitted, std::move(handler));
  }

  // Runs `handler` once commit point `point` completed (inline if it has).
  // Touches no command buffer: callable outside the serial section.
  void addTimelineHandler(uint64_t point, CompletionHandler handler)
      MPS_EXCLUDES(timeline_mu_) {
    {
      MutexLock tl(timeline_mu_);
      if (completed_ < point) {
        deferred_[point].push_back(std::move(handler));
        return;
      }
    }
    handler(CompletionStatus{});
  }

  // The commit point that will carry all work encoded so far.
  uint64_t pendingCommitPoint() const MPS_EXCLUDES(mu_, timeline_mu_) {
    MutexLock lock(mu_);
    MutexLock tl(timeline_mu_);
    return committed_ + (dirty_ ? 1 : 0);
  }
  bool hasUncommittedWork() const MPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return dirty_;
  }
  // For DependencyStream::bindOpenMark(); passes end in the serial section,
  // so it is stable there.
  const std::atomic<uint64_t>& openMarkAtomic() const {
    return open_mark_;
  }
  // The last mark whose signal is in a committed buffer (see commitOpen()).
  uint64_t committedMark() const {
    return committed_mark_.load(std::memory_order_acquire);
  }
  uint64_t lastCommitPoint() const MPS_EXCLUDES(timeline_mu_) {
    MutexLock tl(timeline_mu_);
    return committed_;
  }
  uint64_t completedCommitPoint() const MPS_EXCLUDES(timeline_mu_) {
    MutexLock tl(timeline_mu_);
    return completed_;
  }

  void waitForCommittedMark(uint64_t mark) MPS_EXCLUDES(timeline_mu_) {
    MutexLock tl(timeline_mu_);
    completed_cv_.wait(timeline_mu_, [&] {
      return committed_mark_.load(std::memory_order_acquire) >= mark;
    });
  }

  // Throws if a buffer up to `value` failed and no earlier wait reported it.
  void waitForCommitPoint(uint64_t value) MPS_EXCLUDES(timeline_mu_) {
    MutexLock tl(timeline_mu_);
    completed_cv_.wait(timeline_mu_, [&]() MPS_REQUIRES(timeline_mu_) {
      return completed_ >= value;
    });
    if (!errors_.empty() && errors_.begin()->first <= value) {
      std::string message = errors_.begin()->second;
      errors_.erase(errors_.begin(), errors_.upper_bound(value));
      TORCH_CHECK(false, "MPS command buffer execution failed: ", message);
    }
  }

 private:
  // Opens the buffer if none is; the open pass now carries work.
  Buffer markPassUsed() MPS_REQUIRES(mu_) {
    if (!has_buffer_) {
      buffer_ = ops_.makeBuffer(queue_);
      has_buffer_ = true;
    }
    dirty_ = pass_has_work_ = true;
    return buffer_;
  }

  // Ends the open pass: its encoder, and its mark if it carried work.
  void endEncoder() MPS_REQUIRES(mu_) {
    if (has_encoder_) {
      ops_.endEncoding(encoder_);
      has_encoder_ = false;
    }
    if (pass_has_work_) {
      const uint64_t mark = open_mark_.load(std::memory_order_relaxed);
      ops_.signalTimeline(buffer_, mark);
      open_mark_.store(mark + 1, std::memory_order_release);
      pass_has_work_ = false;
    }
  }

  // Commits the open buffer as the next commit point, unless it is clean.
  void commitOpen(bool keep_open) MPS_REQUIRES(mu_) MPS_EXCLUDES(timeline_mu_) {
    if (!has_buffer_ || !dirty_) {
      return;
    }
    dirty_ = false;
    const uint64_t point = [this] {
      MutexLock tl(timeline_mu_);
      return ++committed_;
    }();
    ops_.addCompletedHandler(
        buffer_, [this, point](const CompletionStatus& status) {
          markCompleted(point, status);
        });
    // Callers end the pass first, so every signalled mark goes with it.
    const uint64_t signalled = open_mark_.load(std::memory_order_relaxed) - 1;
    if (keep_open) {
      ops_.commitAndContinue(buffer_);
    } else {
      ops_.commit(buffer_);
      has_buffer_ = false;
    }
    // Published after the commit: other streams wait only for marks seen here.
    MutexLock tl(timeline_mu_);
    committed_mark_.store(signalled, std::memory_order_release);
    completed_cv_.notifyAll();
  }

  void markCompleted(uint64_t point, const CompletionStatus& status)
      MPS_EXCLUDES(timeline_mu_) {
    std::vector<std::pair<CompletionHandler, CompletionStatus>> ready;
    {
      MutexLock tl(timeline_mu_);
      if (!status.ok) {
        errors_.emplace(point, status.error);
      }
      done_out_of_order_.insert(point);
      while (done_out_of_order_.erase(completed_ + 1) != 0) {
        ++completed_;
      }
      auto end = deferred_.upper_bound(completed_);
      for (auto it = deferred_.begin(); it != end; ++it) {
        // A deferred handler covers every commit point up to its key.
        CompletionStatus covered;
        if (!errors_.empty() && errors_.begin()->first <= it->first) {
          covered = CompletionStatus{false, errors_.begin()->second};
        }
        for (auto& h : it->second) {
          ready.emplace_back(std::move(h), covered);
        }
      }
      deferred_.erase(deferred_.begin(), end);
      // Notify under the lock: a woken waiter may destroy this object (see
      // the destructor), so nothing below may touch a member.
      completed_cv_.notifyAll();
    }
    for (auto& [handler, covered] : ready) {
      handler(covered);
    }
  }

  Ops ops_;
  const Queue queue_;
  const bool commit_and_continue_;

  // Completion handlers take only timeline_mu_.
  mutable Mutex mu_ MPS_ACQUIRED_BEFORE(timeline_mu_);
  bool has_buffer_ MPS_GUARDED_BY(mu_) = false;
  // Set when the buffer or encoder is handed out, cleared by a commit.
  bool dirty_ MPS_GUARDED_BY(mu_) = false;
  // Set with dirty_, cleared when the pass ends (and its mark is signalled).
  bool pass_has_work_ MPS_GUARDED_BY(mu_) = false;
  // Written under mu_ (committed_mark_ also under timeline_mu_, for
  // waitForCommittedMark()); read without locks.
  std::atomic<uint64_t> open_mark_{1};
  std::atomic<uint64_t> committed_mark_{0};
  Buffer buffer_ MPS_GUARDED_BY(mu_){};
  bool has_encoder_ MPS_GUARDED_BY(mu_) = false;
  Encoder encoder_ MPS_GUARDED_BY(mu_){};

  mutable Mutex timeline_mu_;
  CondVar completed_cv_;
  uint64_t committed_ MPS_GUARDED_BY(timeline_mu_) = 0;
  uint64_t completed_ MPS_GUARDED_BY(timeline_mu_) = 0;
  std::set<uint64_t> done_out_of_order_ MPS_GUARDED_BY(timeline_mu_);
  std::map<uint64_t, std::vector<CompletionHandler>> deferred_
      MPS_GUARDED_BY(timeline_mu_);
  // Failed commit points not yet reported by a wait.
  std::map<uint64_t, std::string> errors_ MPS_GUARDED_BY(timeline_mu_);
};

} // namespace at::mps
