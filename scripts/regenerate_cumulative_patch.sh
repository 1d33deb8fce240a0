#!/usr/bin/env bash
# Rebuilds patches/cumulative-v2.9.1-to-mps-stream-pool.patch and the patch
# series (patches/series/, scripts/series.py) from fork-overlay/. With
# --check, writes nothing and exits 1 (naming the files) when the committed
# cumulative patch differs from what the overlay produces; `scripts/series.py
# check` does the same for the series.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
  --check) exec python3 "$here/overlay.py" check ;;
  "") python3 "$here/overlay.py" generate \
        --out "$here/../patches/cumulative-v2.9.1-to-mps-stream-pool.patch"
      echo "wrote patches/cumulative-v2.9.1-to-mps-stream-pool.patch"
      python3 "$here/series.py" generate ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
