#!/usr/bin/env bash
# Set-up and main job on a fresh Debian machine:
#   1. installs the Debian packages the harness and tests need;
#   2. configures and builds the harness (CMake preset "dev");
#   3. checks that the committed patch matches fork-overlay/;
#   4. verifies the patch against a PyTorch v2.9.1 tree: --pytorch DIR, or
#      the rebuilt baseline cache if present; with --apply (which needs
#      --pytorch: the cache stays unpatched), applies it to DIR.
# Usage: scripts/setup.sh [--pytorch DIR [--apply]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."

"$here/install_deps.sh"

cmake --preset dev >/dev/null
cmake --build --preset dev -j"$(nproc)"
"$here/regenerate_cumulative_patch.sh" --check

baseline=$HOME/.cache/pytorch-v2.9.1-mps-baseline
if [ "$#" -gt 0 ] || [ -d "$baseline" ]; then
  "$here/apply_patch.sh" "$@"
else
  echo "No PyTorch tree given and no baseline cache at $baseline:" \
       "skipping the apply check (pass --pytorch DIR)."
fi
