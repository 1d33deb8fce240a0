#!/usr/bin/env bash
# Checks a PyTorch v2.9.1 tree and applies the MPS stream-pool patch to it.
#   scripts/apply_patch.sh [--pytorch DIR] [--apply]
# Without --pytorch it checks the rebuilt baseline cache
# ($HOME/.cache/pytorch-v2.9.1-mps-baseline). Steps: every upstream file the
# patch edits must have its v2.9.1 blob SHA (patches/upstream-blobs.tsv);
# then git apply --check; with --apply, git apply.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec python3 "$here/overlay.py" verify "$@"
