#!/usr/bin/env bash
# Model-checks tests/model/stream_dependencies.pml (the cross-stream
# dependency protocol: MPSStreamDependencies.cpp, the command-buffer
# lifecycle and Metal's queues) with SPIN, exhaustively, in a temporary
# directory: assertions (GPU work runs in recorded order) and invalid end
# states (deadlock), for each scenario and queue limit below.
#   --old-rule   puts the protocol from before the fix back (-DOLD_RULE), the
#                cycle walk without its re-check (-DNO_REVALIDATE), and the
#                tracker without its read-after-write or write-after-read
#                waits (-DNO_RAW, -DNO_WAR), and a kernel rebinding a buffer
#                its pass wrote recorded as a new use (-DNO_REBIND), and
#                succeeds only if SPIN finds the deadlock, the false "no
#                order exists" error, or the out-of-order GPU use, in each
# The ring scenario runs on 2 streams: on 3 it outgrows 4 GB (63.5 million
# states at 1 in flight, 13 minutes, unfinished).
# Needs spin and gcc; about five minutes on 2 cores.
set -euo pipefail

model="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stream_dependencies.pml"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
failed=0

# check NAME EXPECT SPIN_FLAGS; EXPECT is "ok" or "error"
check() {
  local name=$1 expect=$2 out errors states secs
  # shellcheck disable=SC2086
  spin $3 -a "$model" >spin.log 2>&1 || { cat spin.log; exit 2; }
  # -O0: pan.c compiles in seconds; -O2 saves less run time than it costs
  gcc -O0 -w -DSAFETY -DCOLLAPSE -DVECTORSZ=4096 -DMEMLIM=4096 -o pan pan.c
  out="$(./pan -m100000 2>&1)" || true
  errors="$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out")"
  states="$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' <<<"$out")"
  secs="$(sed -n 's/^pan: elapsed time \([0-9.e+]*\).*/\1/p' <<<"$out")"
  if [[ "$expect" == ok ]] &&
    grep -qE 'MEMLIM|not completed|too small|max search depth' <<<"$out"; then
    echo "stream_dependencies $name: FAILED (search incomplete)"
    grep -E 'MEMLIM|not completed|too small|depth' <<<"$out" | sed 's/^/  /'
    failed=1
  elif [[ "$expect" == ok && "$errors" != 0 ]]; then
    echo "stream_dependencies $name: FAILED (errors: ${errors:-?})"
    grep -E '^pan:[0-9]+:|errors:' <<<"$out" | sed 's/^/  /'
    failed=1
  elif [[ "$expect" == error && "$errors" == 0 ]]; then
    echo "stream_dependencies $name: FAILED (the broken protocol was not caught)"
    failed=1
  else
    echo "stream_dependencies $name: $errors errors, $states states, $secs s" \
      "$(grep -E '^pan:[0-9]+:' <<<"$out" || true)"
  fi
}

if [[ "${1:-}" == --old-rule ]]; then
  check "old rule, cycle scenario, 2 streams" error \
    "-DOLD_RULE -DSCENARIO=1 -DNS=2 -DCAP=2"
  check "old rule, in-pass scenario, 2 streams" error \
    "-DOLD_RULE -DSCENARIO=2 -DNS=2 -DCAP=2"
  check "cycle walk without its re-check, 2 streams" error \
    "-DNO_REVALIDATE -DSCENARIO=1 -DNS=2 -DCAP=2"
  check "no read-after-write wait, ring scenario, 2 streams" error \
    "-DNO_RAW -DSCENARIO=3 -DNS=2 -DCAP=2"
  check "no write-after-read wait, ring scenario, 2 streams" error \
    "-DNO_WAR -DSCENARIO=3 -DNS=2 -DCAP=2"
  check "rebinding recorded again, rebind scenario, 2 streams" error \
    "-DNO_REBIND -DSCENARIO=4 -DNS=2 -DCAP=2"
  exit "$failed"
fi
for cap in 1 2; do
  check "cycle scenario, 2 streams, $cap in flight" ok \
    "-DSCENARIO=1 -DNS=2 -DCAP=$cap"
  check "in-pass scenario, 2 streams, $cap in flight" ok \
    "-DSCENARIO=2 -DNS=2 -DCAP=$cap"
  check "ring and reuse scenario, 2 streams, $cap in flight" ok \
    "-DSCENARIO=3 -DNS=2 -DCAP=$cap"
  check "rebind scenario, 2 streams, $cap in flight" ok \
    "-DSCENARIO=4 -DNS=2 -DCAP=$cap"
done
exit "$failed"
