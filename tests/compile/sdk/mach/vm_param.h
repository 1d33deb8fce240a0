// Declaration-only stand-in for Darwin's <mach/vm_param.h>, written from
// Apple's public documentation for a syntax check on Linux; not Apple's
// header. On arm64 macOS the page size is the run-time variable vm_page_size.
#pragma once
#include <mach/vm_page_size.h>

#define PAGE_SIZE vm_page_size
