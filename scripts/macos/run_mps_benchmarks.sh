#!/usr/bin/env bash
# Runs the MPS thread-scaling and batching benchmarks (bench_mps_parallel.py)
# and bundles the results with a description of the machine into one
# .tar.gz, ready to attach to a report.
#
#   scripts/macos/run_mps_benchmarks.sh [--python PY] [--out DIR] [--label TEXT]
#                                       [--quick] [-- BENCH_ARGS...]
#
#   --python PY   interpreter whose torch is measured (default: python3)
#   --out DIR     results directory (default: ./mps-bench-<host>-<UTC time>)
#   --label TEXT  stored with the results, e.g. "patched" or "stock-2.9.1"
#   --quick       fewer thread counts and iterations (about a minute)
#   BENCH_ARGS    passed on to bench_mps_parallel.py (see its --help)
#
# Works with macOS's /bin/bash 3.2.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() { sed -n '2,14s/^# \{0,1\}//p' "$0"; }
die() { echo "error: $*" >&2; exit 2; }
need_value() { [ "$2" -ge 2 ] || die "$1 needs a value"; }

python=python3 out="" label="" quick=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) need_value "$1" $#; python=$2; shift 2 ;;
    --out) need_value "$1" $#; out=$2; shift 2 ;;
    --label) need_value "$1" $#; label=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

command -v "$python" >/dev/null || die "python interpreter not found: $python"
if [ -z "$out" ]; then
  out="$PWD/mps-bench-$(hostname -s)-$(date -u +%Y%m%dT%H%M%SZ)"
fi
mkdir -p "$out" || die "cannot create $out"

# What the numbers depend on: chip, GPU cores, memory, OS, power source, torch build.
{
  echo "== date"; date -u
  echo "== uname"; uname -a
  if command -v sw_vers >/dev/null; then echo "== sw_vers"; sw_vers; fi
  if command -v sysctl >/dev/null; then
    echo "== sysctl"
    sysctl machdep.cpu.brand_string hw.memsize hw.ncpu hw.perflevel0.physicalcpu hw.perflevel1.physicalcpu 2>/dev/null
  fi
  if command -v system_profiler >/dev/null; then
    echo "== GPU"; system_profiler SPDisplaysDataType 2>/dev/null | grep -E "Chipset Model|Total Number of Cores|Metal"
  fi
  if command -v pmset >/dev/null; then echo "== power"; pmset -g batt 2>/dev/null | head -2; fi
  echo "== torch"
  "$python" -c 'import sys, torch
print(sys.version.split()[0], torch.__version__, torch.version.git_version, torch.__file__)
print("mps available:", torch.backends.mps.is_available())
print("stream pool:", hasattr(torch.mps, "release_current_thread_slot"))'
  echo "== environment"; env | grep -E '^(MPS_|PYTORCH_)' || true
} >"$out/system.txt" 2>&1

bench_args=(--out "$out")
[ -n "$label" ] && bench_args+=(--label "$label")
if [ "$quick" -eq 1 ]; then
  bench_args+=(--threads "1,2,4,8" --iters 30 --batching-threads "8,16" --requests 50)
fi

echo "benchmarking $("$python" -c 'import torch; print(torch.__version__)') -> $out"
"$python" "$here/bench_mps_parallel.py" "${bench_args[@]}" ${extra[@]+"${extra[@]}"} 2>&1 | tee "$out/bench.log"
status=${PIPESTATUS[0]}

tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
echo
echo "results: $out (bench_mps_parallel.json, bench_mps_parallel.png, system.txt, bench.log)"
echo "bundle:  $out.tar.gz  <- attach this file to your report"
if [ "$status" -ne 0 ]; then
  echo "the benchmark reported errors (exit status $status); see $out/bench.log" >&2
fi
exit "$status"
