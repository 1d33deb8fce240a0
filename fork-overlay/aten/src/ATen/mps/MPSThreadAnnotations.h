#pragma once

// Clang thread-safety annotations and an annotated mutex for the MPS stream
// pool and its companions.
//
// c10 has no lock annotations and libc++/libstdc++ do not annotate
// std::mutex, so Clang's -Wthread-safety cannot see through a plain
// std::mutex. The wrappers below carry the capability attributes; on other
// compilers the macros expand to nothing and the wrappers are zero-cost
// forwards to the standard types.

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__) && !defined(SWIG)
#define MPS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MPS_THREAD_ANNOTATION(x)
#endif

#define MPS_CAPABILITY(x) MPS_THREAD_ANNOTATION(capability(x))
#define MPS_SCOPED_CAPABILITY MPS_THREAD_ANNOTATION(scoped_lockable)
#define MPS_GUARDED_BY(x) MPS_THREAD_ANNOTATION(guarded_by(x))
#define MPS_PT_GUARDED_BY(x) MPS_THREAD_ANNOTATION(pt_guarded_by(x))
#define MPS_ACQUIRED_BEFORE(...) \
  MPS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define MPS_ACQUIRED_AFTER(...) \
  MPS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define MPS_REQUIRES(...) \
  MPS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define MPS_ACQUIRE(...) MPS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define MPS_RELEASE(...) MPS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define MPS_TRY_ACQUIRE(...) \
  MPS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define MPS_EXCLUDES(...) MPS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define MPS_RETURN_CAPABILITY(x) MPS_THREAD_ANNOTATION(lock_returned(x))
// Escape hatch: every use carries a one-line reason next to it.
#define MPS_NO_THREAD_SAFETY_ANALYSIS \
  MPS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace at::mps {

// A std::mutex the analysis can reason about.
class MPS_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() MPS_ACQUIRE() {
    mutex_.lock();
  }
  void unlock() MPS_RELEASE() {
    mutex_.unlock();
  }
  bool try_lock() MPS_TRY_ACQUIRE(true) {
    return mutex_.try_lock();
  }

 private:
  std::mutex mutex_;
};

// RAII holder for a Mutex, in the style of std::lock_guard.
class MPS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) MPS_ACQUIRE(mu) : mu_(mu) {
    mu_.lock();
  }
  ~MutexLock() MPS_RELEASE() {
    mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// Condition variable for Mutex. wait() must be called with the mutex held;
// it is released while blocked and held again on return, so the analysis
// treats the capability as held throughout. Callers are checked for holding
// `mu`; the bodies of the predicate forms are not analysed because the
// analysis cannot tie a predicate's own annotation to the `mu` parameter
// (the predicate always runs with `mu` held).
class CondVar {
 public:
  void wait(Mutex& mu) MPS_REQUIRES(mu) {
    cv_.wait(mu);
  }
  template <typename Pred>
  void wait(Mutex& mu, Pred pred)
      MPS_REQUIRES(mu) MPS_NO_THREAD_SAFETY_ANALYSIS {
    while (!pred()) {
      cv_.wait(mu);
    }
  }
  // Returns pred() at return: false means the deadline passed first.
  template <typename Pred>
  bool waitFor(Mutex& mu, std::chrono::nanoseconds timeout, Pred pred)
      MPS_REQUIRES(mu) MPS_NO_THREAD_SAFETY_ANALYSIS {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (cv_.wait_until(mu, deadline) == std::cv_status::timeout) {
        return pred();
      }
    }
    return true;
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
