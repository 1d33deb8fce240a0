#pragma once

// Clang thread-safety macros and an annotated Mutex, which c10 and std lack.

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define MPS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MPS_THREAD_ANNOTATION(x)
#endif

#define MPS_GUARDED_BY(x) MPS_THREAD_ANNOTATION(guarded_by(x))
#define MPS_ACQUIRED_BEFORE(x) MPS_THREAD_ANNOTATION(acquired_before(x))
#define MPS_REQUIRES(x) MPS_THREAD_ANNOTATION(requires_capability(x))
#define MPS_ACQUIRE(...) MPS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define MPS_RELEASE(...) MPS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define MPS_EXCLUDES(...) MPS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// Escape hatch: every use carries a one-line reason next to it.
#define MPS_NO_THREAD_SAFETY_ANALYSIS \
  MPS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace at::mps {

class MPS_THREAD_ANNOTATION(capability("mutex")) Mutex {
 public:
  void lock() MPS_ACQUIRE() {
    mutex_.lock();
  }
  void unlock() MPS_RELEASE() {
    mutex_.unlock();
  }

 private:
  std::mutex mutex_;
};

// Holds an annotated lock (a capability with lock()/unlock()) for its scope.
template <typename Lock>
class MPS_THREAD_ANNOTATION(scoped_lockable) ScopedLock {
 public:
  explicit ScopedLock(Lock& lock) MPS_ACQUIRE(lock) : lock_(lock) {
    lock_.lock();
  }
  ~ScopedLock() MPS_RELEASE() {
    lock_.unlock();
  }
  ScopedLock(const ScopedLock&) = delete; // lock_ forbids assignment

 private:
  Lock& lock_;
};
using MutexLock = ScopedLock<Mutex>;

// Condition variable for Mutex. The predicate forms are not analysed: the
// analysis cannot tie a predicate's annotation to `mu` (held when it runs).
class CondVar {
 public:
  void wait(Mutex& mu) MPS_REQUIRES(mu) {
    cv_.wait(mu);
  }
  template <typename Pred>
  void wait(Mutex& mu, Pred pred)
      MPS_REQUIRES(mu) MPS_NO_THREAD_SAFETY_ANALYSIS {
    cv_.wait(mu, pred);
  }
  // Returns pred() at return: false means the timeout passed first.
  template <typename Pred>
  bool waitFor(Mutex& mu, std::chrono::nanoseconds timeout, Pred pred)
      MPS_REQUIRES(mu) MPS_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_for(mu, timeout, pred);
  }
  void notifyOne() {
    cv_.notify_one();
  }
  void notifyAll() {
    cv_.notify_all();
  }

 private:
  std::condition_variable_any cv_;
};

} // namespace at::mps
