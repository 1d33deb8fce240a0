// Mixed C++/Objective-C exceptions in Objective-C++ on GCC's runtime.
//
// With -fobjc-runtime=gcc, clang gives every Objective-C++ function GCC's
// Objective-C personality routine, __gnu_objc_personality_v0, which matches
// only Objective-C exceptions: a C++ exception (a c10::Error from
// TORCH_CHECK) passes every `catch` of a C++ type in an .mm file, and the
// glue's rethrow paths and the tests' catch clauses never see it. On macOS
// the Objective-C personality defers to the C++ one for C++ exceptions.
//
// This definition, in the test executable, comes first in the dynamic
// linker's search and so is the routine every .mm frame's unwind info names.
// It does what Apple's does: an exception of GCC's Objective-C class goes to
// libobjc's routine, any other to the C++ one. Nothing the glue builds
// catches Objective-C exceptions with @catch, so no frame mixes the two kinds
// of type table entry.

#include <dlfcn.h>
#include <unwind.h>

#include <cstdio>
#include <cstdlib>

namespace {

using Personality = _Unwind_Reason_Code (*)(
    int,
    _Unwind_Action,
    _Unwind_Exception_Class,
    _Unwind_Exception*,
    _Unwind_Context*);

// "GNUCOBJC", GCC libobjc's exception class (libobjc/exception.c).
constexpr _Unwind_Exception_Class kObjCExceptionClass = 0x474e55434f424a43ULL;

Personality objcPersonality() {
  static const Personality next = [] {
    auto found = reinterpret_cast<Personality>(
        dlsym(RTLD_NEXT, "__gnu_objc_personality_v0"));
    if (found == nullptr) {
      std::fprintf(stderr, "libobjc's __gnu_objc_personality_v0 not found\n");
      std::abort();
    }
    return found;
  }();
  return next;
}

} // namespace

extern "C" _Unwind_Reason_Code __gxx_personality_v0(
    int,
    _Unwind_Action,
    _Unwind_Exception_Class,
    _Unwind_Exception*,
    _Unwind_Context*);

extern "C" _Unwind_Reason_Code __gnu_objc_personality_v0(
    int version,
    _Unwind_Action actions,
    _Unwind_Exception_Class exception_class,
    _Unwind_Exception* exception,
    _Unwind_Context* context) {
  if (exception_class == kObjCExceptionClass) {
    return objcPersonality()(
        version, actions, exception_class, exception, context);
  }
  return __gxx_personality_v0(
      version, actions, exception_class, exception, context);
}
