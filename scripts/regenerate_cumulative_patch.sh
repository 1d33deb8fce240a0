#!/usr/bin/env bash
# Rebuilds patches/cumulative-v2.9.1-to-mps-stream-pool.patch from
# fork-overlay/. With --check, writes nothing and exits 1 (naming the files)
# when the committed patch differs from what the overlay produces.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
  --check) exec python3 "$here/overlay.py" check ;;
  "") python3 "$here/overlay.py" generate \
        --out "$here/../patches/cumulative-v2.9.1-to-mps-stream-pool.patch"
      echo "wrote patches/cumulative-v2.9.1-to-mps-stream-pool.patch" ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
