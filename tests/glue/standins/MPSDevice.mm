// Stand-in for aten/src/ATen/mps/MPSDevice.mm, which cannot be built here:
// it reads MTLCopyAllDevices() with object subscripting (`devices[i]`),
// which clang rejects with -fobjc-runtime=gcc, and counts GPU cores through
// IOKit (tests/glue/upstream.tsv). It implements the v2.9.1 MPSDevice.h of
// the wheel with the simulated device, playing macOS 15.2 or newer (every
// MacOSVersion gate open, as the SDK stand-ins play the macOS 15 SDK).

#include <ATen/mps/MPSAllocatorInterface.h>
#include <ATen/mps/MPSDevice.h>

namespace at::mps {

MPSDevice* MPSDevice::getInstance() {
  static MPSDevice mps_device;
  return &mps_device;
}

MPSDevice::~MPSDevice() {
  [_mtl_device release];
  _mtl_device = nil;
}

MPSDevice::MPSDevice() : _mtl_device(MTLCreateSystemDefaultDevice()) {}

bool MPSDevice::isMacOS13Plus(MacOSVersion version) const {
  return true;
}

std::string MPSDevice::getName() const {
  @autoreleasepool {
    return [[_mtl_device name] UTF8String];
  }
}

unsigned MPSDevice::getCoreCount() const {
  return 8;
}

at::Allocator* GetMPSAllocator(bool useSharedAllocator) {
  return getIMPSAllocator(useSharedAllocator);
}

bool is_available() {
  return MPSDevice::getInstance()->device() != nil;
}

bool is_macos_13_or_newer(MacOSVersion version) {
  return MPSDevice::getInstance()->isMacOS13Plus(version);
}

} // namespace at::mps
