#!/usr/bin/env bash
# Runs every GoogleTest program in DIR RUNS times, P at a time, each run with
# the tests shuffled by its own seed and bounded by a timeout, and counts the
# runs that fail or hang. Used on the 16-core device machine, where test
# programs built here are carried in (it has no toolchain); see
# reports/performance.md.
#   scripts/flake_hunt.sh DIR RUNS [P] [LOGDIR]
# Environment passes through (MPS_STRESS_SCALE, TSAN_OPTIONS, ASAN_OPTIONS).
# Exits non-zero if any run failed; the output of each failed run is kept in
# LOGDIR (default: a temporary directory) as PROGRAM.SEED.log.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR RUNS [P] [LOGDIR]" >&2
  exit 2
fi
dir=$1 runs=$2 par=${3:-$(nproc)} logs=${4:-$(mktemp -d)}
mkdir -p "$logs"
export logs
# one_run PROGRAM SEED: prints "ok", "FAIL" or "HANG" and keeps failed logs.
one_run() {
  local prog=$1 seed=$2 log st
  log="$logs/$(basename "$prog").$seed.log"
  timeout 300 "$prog" --gtest_shuffle --gtest_random_seed="$seed" >"$log" 2>&1
  st=$?
  if [ $st -eq 0 ]; then
    rm -f "$log"
    echo "ok $(basename "$prog")"
  elif [ $st -eq 124 ]; then
    echo "HANG $(basename "$prog") seed $seed"
  else
    echo "FAIL $(basename "$prog") seed $seed"
  fi
}
export -f one_run
start=$(date +%s)
results=$(
  for prog in "$dir"/*; do
    [ -x "$prog" ] || continue
    for seed in $(seq 1 "$runs"); do echo "$prog $seed"; done
  done | xargs -P "$par" -n 2 bash -c 'one_run "$0" "$1"'
)
grep -v '^ok ' <<<"$results" | sort | head -50
total=$(grep -c . <<<"$results")
passed=$(grep -c '^ok ' <<<"$results")
failed=$(grep -c '^FAIL' <<<"$results")
hung=$(grep -c '^HANG' <<<"$results")
echo "flake hunt: $total runs, $passed passed, $failed failed, $hung hung," \
  "$(($(date +%s) - start)) s, $par at a time"
! grep -qE '^(FAIL|HANG)' <<<"$results"
