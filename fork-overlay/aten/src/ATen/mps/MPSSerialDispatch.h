#pragma once

#include <c10/macros/Export.h>

#include <exception>
#include <type_traits>
#include <utility>

namespace at::mps {

// Note [MPS serial sections]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every MPS stream encodes inside its serial section: blocks run with
// dispatch_sync on the stream's serial queue. dispatchSyncWithRethrow adds:
//  - Exceptions. A C++ exception must not unwind through libdispatch, so it
//    is caught on the queue and rethrown in the caller.
//  - Re-entry. dispatch_sync onto a queue whose block is already running up
//    the call chain deadlocks. A chain of SerialSections records the queues
//    the current call is inside, and a dispatch onto any of them runs inline.
//    The chain follows the logical call, not the thread: a block's section
//    links to the sections of the thread that dispatched it, so the answer
//    does not depend on which thread libdispatch runs the block on. Sections
//    live on the stack and a dispatching thread blocks until its block
//    returns, so every section outlives those linked below it.
// Code entering a queue by other means (its own dispatch_sync) should open a
// SerialSection for it inside its block.
class TORCH_API SerialSection {
 public:
  // Nested in the calling thread's sections.
  explicit SerialSection(const void* queue) noexcept
      : SerialSection(queue, innermost()) {}
  // Nested in `outer`, the chain of the thread that dispatched this block.
  SerialSection(const void* queue, const SerialSection* outer) noexcept;
  ~SerialSection();
  SerialSection(const SerialSection&) = delete;
  SerialSection& operator=(const SerialSection&) = delete;

  static const SerialSection* innermost() noexcept;
  static bool isActive(const void* queue) noexcept;

 private:
  const void* const queue_;
  const SerialSection* const outer_;
  const SerialSection* const saved_; // this thread's chain before this one
};

// Runs fn() in `queue`'s serial section and rethrows its exception here.
// dispatch(context, work) must run work(context) synchronously on the queue
// (dispatch_sync_f); fn() runs inline when already in the section.
template <typename Dispatch, typename Fn>
void dispatchSyncWithRethrow(const void* queue, Dispatch&& dispatch, Fn&& fn) {
  if (SerialSection::isActive(queue)) {
    std::forward<Fn>(fn)();
    return;
  }
  struct Call {
    const void* queue;
    const SerialSection* caller;
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
