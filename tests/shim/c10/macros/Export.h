#pragma once

// Harness stand-in for <c10/macros/Export.h>: everything is one static
// library in the harness, so TORCH_API needs no visibility attribute.

#define TORCH_API
