// Declaration-only stand-in for <simd/simd.h>, written from Apple's public
// documentation (developer.apple.com/documentation/simd) for a syntax check
// on Linux; not Apple's header. Only the vector types PyTorch's MPS sources
// use: simd_ulong1 is a 64-bit unsigned integer (Swift: UInt), simd_uint3 and
// simd_ulong3 are three-element vectors of 32-bit and 64-bit unsigned
// integers (clang ext_vector_type, which pads three elements to four).
#pragma once

typedef unsigned long simd_ulong1;
typedef __attribute__((__ext_vector_type__(3))) unsigned int simd_uint3;
typedef __attribute__((__ext_vector_type__(3))) simd_ulong1 simd_ulong3;
