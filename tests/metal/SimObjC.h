#pragma once

// Objective-C objects of the simulated frameworks (tests/metal,
// tests/dispatch) keep their state in one C++ object placed in the instance's
// extra bytes (class_createInstance's indexed ivars): the classes that the
// SDK stand-ins declare have no instance variables, and GCC's runtime (a
// fragile ABI) cannot add any in an @implementation.
//
// The reference count lives there too, as a std::atomic: GNUstep keeps its
// own count inside the uninstrumented library, where the sanitizers cannot
// see the release that hands the last reference from one thread to another,
// and would report the dealloc as racing with the earlier owner's accesses.
//
// Blocks are not objects under GCC's runtime (sending them -copy or -release
// crashes), so the frameworks hold them through HeldBlock.

#include <Block.h>
#import <Foundation/Foundation.h>
#include <objc/runtime.h>

#include <atomic>
#include <memory>
#include <new>

namespace sim::objc {

template <typename T>
struct Boxed {
  std::atomic<NSUInteger> refs{1};
  T state;
};

template <typename T>
Boxed<T>& boxOf(id object) {
  return *static_cast<Boxed<T>*>(object_getIndexedIvars(object));
}

template <typename T>
T& state(id object) {
  return boxOf<T>(object).state;
}

template <typename T>
id allocate(Class cls, NSZone* zone) {
  static_assert(alignof(Boxed<T>) <= alignof(void*), "extra bytes follow the instance variables at pointer alignment");
  id object = NSAllocateObject(cls, sizeof(Boxed<T>), zone);
  new (object_getIndexedIvars(object)) Boxed<T>();
  return object;
}

template <typename T>
void retain(id object) {
  boxOf<T>(object).refs.fetch_add(1, std::memory_order_relaxed);
}

// True when the last reference went: the caller deallocates.
template <typename T>
bool release(id object) {
  return boxOf<T>(object).refs.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

template <typename T>
NSUInteger retainCount(id object) {
  return boxOf<T>(object).refs.load(std::memory_order_acquire);
}

template <typename T>
void destroy(id object) {
  boxOf<T>(object).~Boxed<T>();
}

// A heap copy of a block: Block_copy when made, Block_release when the last
// HeldBlock sharing it goes.
template <typename B>
class HeldBlock {
 public:
  explicit HeldBlock(B block) : copy_(_Block_copy((const void*)block), _Block_release) {}
  B get() const {
    return (B)copy_.get();
  }

 private:
  std::shared_ptr<const void> copy_;
};

} // namespace sim::objc

// The memory management of a class whose state is `T`: T's constructor runs
// at +alloc, its destructor at -dealloc.
// clang-format off
#define SIM_OBJC_STATE(T)                                       \
  +(id)allocWithZone : (NSZone*)zone {                          \
    return sim::objc::allocate<T>(self, zone);                  \
  }                                                             \
  -(id)retain {                                                 \
    sim::objc::retain<T>(self);                                 \
    return self;                                                \
  }                                                             \
  -(oneway void)release {                                       \
    if (sim::objc::release<T>(self)) {                          \
      [self dealloc];                                           \
    }                                                           \
  }                                                             \
  -(void)dealloc {                                              \
    sim::objc::destroy<T>(self);                                \
    [super dealloc];                                            \
  }

#define SIM_OBJC_RETAIN_COUNT(T)                                \
  -(NSUInteger)retainCount {                                    \
    return sim::objc::retainCount<T>(self);                     \
  }
// clang-format on
