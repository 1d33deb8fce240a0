#!/usr/bin/env bash
# Model-checks tests/model/stream_lease.pml (the MPS stream-slot lease
# lifecycle of MPSStreamPool.cpp under the rule of commit 8711536: each
# binding keeps the slots its exchanges displaced, an exchange back to the
# last one pops it, and releaseCurrentThreadSlot() raises while any is
# open; an exchange's query of the current slot never waits or throws,
# Note [MPS stream queries]) with SPIN, exhaustively, in a temporary directory, at 2 worker slots
# and 4 threads:
#   safety:   assertions, the invariants and invalid end states (deadlock),
#             in one run over every exhaustion policy (init picks it), with
#             thread 0 making 3 calls (currentStream, release, set_stream,
#             a guard scope); and again with thread 0 making 4 calls and
#             thread 1 none (longer set_stream/guard sequences, a deeper
#             displaced stack);
#   liveness: ltl live (every waiter is served or times out) under weak
#             fairness, in one run over the policies that wait (-1 and
#             N > 0), without fork() (the child shares nothing with parent
#             waiters) and with thread 0 making 3 calls (so that its op
#             after a guard's query on an exhausted pool waits too).
# 3 worker slots are not checked: with 4 threads they allow only one waiter
# at a time, a case 2 slots cover next to two waiters, and the model keeps
# the free list as a set, so a third slot only renames slots.
# Exits non-zero, with SPIN's error lines, if a check finds an error or
# does not finish.
#   --old-bugs  puts back, one at a time, ~ThreadBindings without the
#               fork-generation test (-DOLD_CHILD_EXIT), the release without
#               its check (-DOLD_RELEASE_IN_GUARD), the rule before
#               8711536, with Binding::released (-DOLD_RELEASED_RULE), and
#               queries that apply the exhaustion policy
#               (-DOLD_QUERY_LEASES); succeeds only if SPIN reports the
#               error each causes
#   --gaps      what the current rule cannot tell apart (see the model's
#               header): exchanges that pop across a scope's boundary
#               (-DUNDO_ACROSS_GUARD) and releases refused outside every
#               scope (-DCHECK_REFUSALS); succeeds only if SPIN reports them
#   -DNAME[=V]  a further switch of the model (not NS, POLICY, POLICY_FROM,
#               OPS0, OPS1, DMAX, SPURIOUS or NOFORK, which the checks set),
#               passed to every run
# Needs spin and gcc; about 50 s of CPU (--old-bugs 8 s, --gaps 5 s).
set -euo pipefail

model="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stream_lease.pml"
mode=default
extra=()
for arg in "$@"; do
  case "$arg" in
    --old-bugs) mode=old ;;
    --gaps) mode=gaps ;;
    -D*) extra+=("$arg") ;;
    *) echo "usage: $0 [--old-bugs|--gaps] [-DNAME[=VALUE]...]" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
failed=0

# check NAME EXPECT SPIN_FLAGS CC_FLAGS PAN_FLAGS; EXPECT is "ok" or an
# extended regex that SPIN's error line must match; the flag lists are split
# on purpose
check() {
  local name=$1 expect=$2 out errors states secs errline
  # shellcheck disable=SC2086
  spin ${extra[@]+"${extra[@]}"} $3 -a "$model" >spin.log 2>&1 ||
    { cat spin.log; exit 2; }
  # -O0: pan.c (large: every caller of currentIndex() inlines its own
  # continuation) compiles in seconds, at -O1 in half a minute; pan runs
  # twice as long, which costs less
  # shellcheck disable=SC2086
  gcc -O0 -w $4 -DMEMLIM=2048 -o pan pan.c
  # shellcheck disable=SC2086
  out="$(./pan $5 2>&1)" || true
  errors="$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out")"
  states="$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' <<<"$out")"
  secs="$(sed -n 's/^pan: elapsed time \([0-9.e+]*\).*/\1/p' <<<"$out")"
  errline="$(grep -E '^pan:[0-9]+:|acceptance cycle|non-progress' <<<"$out" |
    head -1 || true)"
  if [[ "$expect" != ok ]]; then
    if [[ "${errors:-0}" != 0 ]] && grep -qE "$expect" <<<"$errline"; then
      echo "stream_lease $name: caught: $errline"
    else
      echo "stream_lease $name: FAILED (not caught: ${errline:-no error})"
      failed=1
    fi
  elif [[ "$errors" != 0 ]] || grep -qE \
    '^pan:[0-9]+:|violated|acceptance cycle|MEMLIM|not completed|too small' \
    <<<"$out"; then
    echo "stream_lease $name: FAILED (errors: ${errors:-?})"
    grep -E '^pan:[0-9]+:|errors:|MEMLIM|not completed|too small' \
      <<<"$out" | head -20 | sed 's/^/  /'
    failed=1
  else
    echo "stream_lease $name: $errors errors, $states states, $secs s"
  fi
}

safety=("-DSAFETY -DNOCLAIM" "")
liveness=("-DNFAIR=3" "-a -f")
if [[ "$mode" == old ]]; then
  check "OLD_CHILD_EXIT" 'hookInChild' "-DNS=2 -DOLD_CHILD_EXIT" \
    "${safety[@]}"
  check "OLD_RELEASE_IN_GUARD" 'leaseInRestore' \
    "-DNS=2 -DOLD_RELEASE_IN_GUARD" "${safety[@]}"
  check "OLD_RELEASED_RULE" 'guardMissesTarget|leaseInRestore|badBinding' \
    "-DNS=2 -DOLD_RELEASED_RULE" "${safety[@]}"
  check "OLD_QUERY_LEASES" 'queryBlocks' "-DNS=2 -DOLD_QUERY_LEASES" \
    "${safety[@]}"
  exit "$failed"
fi
if [[ "$mode" == gaps ]]; then
  check "UNDO_ACROSS_GUARD" 'leaseInRestore' "-DNS=2 -DUNDO_ACROSS_GUARD" \
    "${safety[@]}"
  check "CHECK_REFUSALS" 'spuriousRefusal' "-DNS=2 -DCHECK_REFUSALS" \
    "${safety[@]}"
  exit "$failed"
fi
check "safety NS=2 policy=any" ok "-DNS=2" "${safety[@]}"
check "safety NS=2 policy=any, thread 0 4 calls, thread 1 none" ok \
  "-DNS=2 -DOPS0=4 -DOPS1=0 -DDMAX=7" "${safety[@]}"
check "liveness NS=2 policy=wait|timeout" ok \
  "-DNS=2 -DPOLICY_FROM=2 -DOPS0=3 -DSPURIOUS=0 -DNOFORK" "${liveness[@]}"
exit "$failed"
