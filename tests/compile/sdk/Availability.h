// Declaration-only stand-in for <Availability.h>, written from Apple's public
// documentation for a syntax check on Linux; not Apple's header.
//
// The stand-in SDK plays the macOS 15 SDK: PyTorch's MPSGraph*Ops.h headers
// declare their own fallbacks only when these version macros are missing, so
// defining them makes the macOS 13-15 API come from the stand-in headers.
// The stand-ins carry no availability attributes: a syntax check has no
// deployment target.
#pragma once

#define __MAC_13_0 130000
#define __MAC_13_2 130200
#define __MAC_14_0 140000
#define __MAC_15_0 150000
