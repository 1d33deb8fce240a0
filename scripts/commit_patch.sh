#!/usr/bin/env bash
# Regenerates the cumulative patch and the patch series from the overlay as
# committed in HEAD (so uncommitted overlay edits in the working tree never
# leak into them) and writes them into the working tree's patches/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wt=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
git -C "$root" worktree add --detach -q "$wt" HEAD
"$wt/scripts/regenerate_cumulative_patch.sh" >/dev/null
cp "$wt/patches/cumulative-v2.9.1-to-mps-stream-pool.patch" "$root/patches/"
# Members can be renamed or dropped: replace the whole set.
rm -f "$root"/patches/series/*.patch
cp "$wt"/patches/series/*.patch "$root/patches/series/"
echo "patches/cumulative-v2.9.1-to-mps-stream-pool.patch and patches/series/ regenerated from HEAD's overlay"
