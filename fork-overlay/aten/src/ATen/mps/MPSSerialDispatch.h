#pragma once

// Synchronous dispatch onto a stream's serial queue that propagates C++
// exceptions and runs inline when the caller is already on that queue.

#include <c10/macros/Export.h>

#include <exception>
#include <type_traits>
#include <utility>

namespace at::mps {

// Note [MPS serial sections]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every MPS stream encodes inside its serial section: blocks run with
// dispatch_sync on the stream's serial dispatch queue. dispatchSyncWithRethrow
// is that dispatch with two fixes:
//  - Exceptions. A C++ exception must not unwind through libdispatch, so the
//    block's exception is caught on the queue, carried back, and rethrown in
//    the caller (c10::Error keeps its type and message).
//  - Re-entry. dispatch_sync onto a queue whose block is already running
//    further up the call chain deadlocks. A chain of SerialSections records
//    which queues the current call is inside (nested sections of different
//    queues included), and a dispatch onto any of them runs the block
//    inline. The chain follows the logical call, not the thread: the block's
//    section links to the sections of the thread that dispatched it, so the
//    answer is the same whether libdispatch runs a dispatch_sync block on the
//    calling thread (its usual optimisation) or on another one.
// Dispatches from different threads are serialised by the queue as before;
// an inline re-entry is already inside that serialisation. Sections live on
// the stack of the code that opened them, and a dispatching thread stays
// blocked until its block returns, so every section in a chain outlives the
// sections linked below it.
//
// Code that enters a stream's queue by other means (its own dispatch_sync)
// should open a SerialSection for the queue inside its block, so that
// dispatchSyncWithRethrow called from there runs inline.
class TORCH_API SerialSection {
 public:
  // Marks the calling thread as inside `queue`'s serial section, nested in
  // the sections it is already in.
  explicit SerialSection(const void* queue) noexcept
      : SerialSection(queue, innermost()) {}
  // Same, nested in `outer`: the chain of the thread that dispatched the
  // block this section is opened in.
  SerialSection(const void* queue, const SerialSection* outer) noexcept;
  // Restores the calling thread's chain as it was before this section.
  ~SerialSection();
  SerialSection(const SerialSection&) = delete;
  SerialSection& operator=(const SerialSection&) = delete;

  // The calling thread's innermost section, or nullptr.
  static const SerialSection* innermost() noexcept;
  // Whether the calling thread's chain includes `queue`'s section.
  static bool isActive(const void* queue) noexcept;

 private:
  const void* const queue_;
  const SerialSection* const outer_; // the enclosing section of the call
  const SerialSection* const saved_; // this thread's chain before this one
};

// Runs fn() in `queue`'s serial section and rethrows its exception here.
// `dispatch(context, work)` must run work(context) synchronously on the queue
// (dispatch_sync_f); it is not called when the calling thread is already in
// the section, and fn() then runs inline.
template <typename Dispatch, typename Fn>
void dispatchSyncWithRethrow(const void* queue, Dispatch&& dispatch, Fn&& fn) {
  if (SerialSection::isActive(queue)) {
    std::forward<Fn>(fn)();
    return;
  }
  struct Call {
    const void* queue;
    const SerialSection* caller; // the dispatching thread's chain
    std::remove_reference_t<Fn>* fn;
    std::exception_ptr error;
  } call{queue, SerialSection::innermost(), &fn, nullptr};
  std::forward<Dispatch>(dispatch)(static_cast<void*>(&call), [](void* ctx) {
    Call& c = *static_cast<Call*>(ctx);
    SerialSection section(c.queue, c.caller);
    try {
      (*c.fn)();
    } catch (...) {
      c.error = std::current_exception();
    }
  });
  if (call.error) {
    std::rethrow_exception(call.error);
  }
}

} // namespace at::mps
