// GCC's <objc/objc.h> defines nil as `(id)0`; Apple's runtime headers define
// it as nullptr in C++, so `nil` converts to any pointer type there (PyTorch
// passes nil for NSInteger* and C++ class pointers). Keep Apple's meaning.
#pragma once
#include_next <objc/objc.h>

#ifdef __cplusplus
#undef nil
#define nil nullptr
#undef Nil
#define Nil nullptr
#endif
