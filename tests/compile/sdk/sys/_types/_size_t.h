// Declaration-only stand-in for Apple's <sys/_types/_size_t.h> (it defines
// size_t), for a syntax check on Linux; not Apple's header.
#pragma once
#include <stddef.h>
