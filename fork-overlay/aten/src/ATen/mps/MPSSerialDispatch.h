#pragma once

#include <c10/macros/Export.h>

#include <exception>
#include <type_traits>
#include <utility>

namespace at::mps {

// Note [MPS serial sections]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each MPS stream encodes inside its serial section: blocks dispatch_sync'd
// onto its serial queue. dispatchSyncWithRethrow adds:
//  - Exceptions: a C++ exception must not unwind through libdispatch, so it
//    is caught on the queue and rethrown in the caller.
//  - Re-entry: dispatch_sync onto a queue whose block runs up the call chain
//    deadlocks, so a chain of SerialSections records the queues the call is
//    in and a dispatch onto any of them runs inline. The chain follows the
//    logical call, whichever thread libdispatch picks: a block's section
//    links to its dispatcher's. Sections live on the stack and a dispatcher
//    blocks until its block returns, so each outlives those linked below it.
// Code entering a queue otherwise (own dispatch_sync) opens a SerialSection
// inside its block.
class TORCH_API SerialSection {
 public:
  // `outer`: the chain of the thread that dispatched this block.
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

// Runs fn() in `queue`'s serial section (inline if already in it), rethrowing
// here. dispatch(ctx, work) must behave as dispatch_sync_f(queue, ctx, work).
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
