#!/usr/bin/env bash
# Checks a PyTorch v2.9.1 tree and applies the MPS stream-pool patch to it.
#   scripts/apply_patch.sh [--pytorch DIR [--apply]] [--series]
# Without --pytorch it checks the rebuilt baseline cache
# ($HOME/.cache/pytorch-v2.9.1-mps-baseline). Steps: every upstream file the
# patch edits must have its v2.9.1 blob SHA (patches/upstream-blobs.tsv);
# then git apply --check; with --apply, git apply. With --series, the same
# for patches/series/ (scripts/series.py verify): the members are applied in
# order to a copy of the edited files and must yield the cumulative patch's
# tree before --apply applies them, one by one, to DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
args=() series=0
for a in "$@"; do
  if [ "$a" = --series ]; then series=1; else args+=("$a"); fi
done
if [ "$series" -eq 1 ]; then
  exec python3 "$here/series.py" verify "${args[@]}"
fi
exec python3 "$here/overlay.py" verify "${args[@]}"
