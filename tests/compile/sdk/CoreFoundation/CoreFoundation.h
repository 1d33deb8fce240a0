// Declaration-only stand-in for the part of <CoreFoundation/CoreFoundation.h>
// that PyTorch's MPS sources rely on, written from Apple's public
// documentation for a syntax check on Linux; not Apple's header.
//
// On macOS, Foundation brings Darwin's <mach/vm_param.h> (PAGE_SIZE) in
// through CoreFoundation; GNUstep's Foundation does not, so it comes here.
#pragma once
#include <mach/vm_param.h>

// MacTypes.h, which CoreFoundation includes, defines these (GridSampler.mm
// passes them as BOOL arguments).
#ifndef TRUE
#define TRUE 1
#endif
#ifndef FALSE
#define FALSE 0
#endif

typedef double CFTimeInterval;
