#!/usr/bin/env bash
# Differential compile check of the patch's C++ and Objective-C++ sources
# against PyTorch v2.9.1's headers (reports/compile-check.md). Options go to
# scripts/compile_check.py: --only SUBSTR, --baseline DIR, --overlay DIR, -j N,
# --cache DIR, --unchanged PATH, --jit-shaders, -v. The last line is
# `compile-check: N passed, M failed, K skipped`; the exit status is non-zero
# when anything failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "${PYTHON:-python3}" "$here/compile_check.py" "$@"
