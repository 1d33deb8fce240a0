#!/usr/bin/env bash
# On an Apple Silicon Mac: check and apply the MPS stream-pool patch to a
# PyTorch v2.9.1 checkout, build PyTorch with MPS, then run
# test/test_mps_parallel.py, the CTest harness and the benchmarks.
#
#   scripts/macos/run_mps_parallel_suite.sh [OPTIONS] PYTORCH_DIR
#
#   PYTORCH_DIR      a git checkout of PyTorch v2.9.1 (git clone --recursive
#                    --branch v2.9.1 https://github.com/pytorch/pytorch)
#   --python PY      interpreter of the environment PyTorch is built into and
#                    tested with (default: python3; use a venv or conda env)
#   --jobs N         parallel build jobs (default: number of cores)
#   --skip-build     PYTORCH_DIR is already built into this environment
#   --skip-harness   do not build and run the CTest harness
#   --tsan           also run the harness under ThreadSanitizer
#   --skip-bench     do not run the benchmarks
#   --quick-bench    shorter benchmark run (about a minute)
#   --out DIR        logs and results (default: build/macos-suite/<UTC time>)
#
# Every step logs to DIR/<step>.log; the script goes on after a failed test
# step and exits non-zero if any step failed. Works with /bin/bash 3.2.
# The step functions below are called through `step`, which shellcheck cannot follow.
# shellcheck disable=SC2317
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
patch="$repo/patches/cumulative-v2.9.1-to-mps-stream-pool.patch"
v291=d38164a545b4a4e4e0cf73ce67173f70574890b6

usage() { sed -n '2,21s/^# \{0,1\}//p' "$0"; }
die() { echo "error: $*" >&2; exit 2; }
need_value() { [ "$2" -ge 2 ] || die "$1 needs a value"; }

python=python3 jobs="" out="" pytorch=""
skip_build=0 skip_harness=0 tsan=0 skip_bench=0 quick_bench=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) need_value "$1" $#; python=$2; shift 2 ;;
    --jobs) need_value "$1" $#; jobs=$2; shift 2 ;;
    --out) need_value "$1" $#; out=$2; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --skip-harness) skip_harness=1; shift ;;
    --tsan) tsan=1; shift ;;
    --skip-bench) skip_bench=1; shift ;;
    --quick-bench) quick_bench=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option: $1" ;;
    *) [ -z "$pytorch" ] || die "more than one PYTORCH_DIR given"; pytorch=$1; shift ;;
  esac
done
[ -n "$pytorch" ] || { usage >&2; die "PYTORCH_DIR is required"; }
[ -d "$pytorch/.git" ] || [ -f "$pytorch/.git" ] || die "$pytorch is not a git checkout of PyTorch"
pytorch=$(cd "$pytorch" && pwd)
[ "$(uname -s)" = Darwin ] || die "this suite needs macOS with Apple Silicon (MPS); on Linux use scripts/test.sh"
[ "$(uname -m)" = arm64 ] || echo "warning: $(uname -m) is not arm64; MPS needs Apple Silicon" >&2
command -v "$python" >/dev/null || die "python interpreter not found: $python"
command -v git >/dev/null || die "git not found (xcode-select --install)"
[ -f "$patch" ] || die "missing $patch"
if [ -z "$jobs" ]; then
  jobs=$(sysctl -n hw.ncpu 2>/dev/null || getconf _NPROCESSORS_ONLN)
fi
case "$jobs" in ''|*[!0-9]*) die "--jobs must be a positive integer, got '$jobs'" ;; esac
if [ -z "$out" ]; then
  out="$repo/build/macos-suite/$(date -u +%Y%m%dT%H%M%SZ)"
fi
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)

results=()
failed=0
step() { # step NAME COMMAND...: runs COMMAND, logging to $out/NAME.log
  local name=$1 status
  shift
  echo "== $name (log: $out/$name.log)"
  "$@" 2>&1 | tee "$out/$name.log"
  status=${PIPESTATUS[0]}
  if [ "$status" -eq 0 ]; then
    results+=("ok      $name")
  else
    results+=("FAILED  $name (exit $status, log: $out/$name.log)")
    failed=1
  fi
  return "$status"
}

summary() {
  echo
  echo "== summary ($out)"
  printf '%s\n' ${results[@]+"${results[@]}"}
  [ "$failed" -eq 0 ] && echo "all steps passed" || echo "some steps failed"
}

apply_patch() {
  local head
  head=$(git -C "$pytorch" rev-parse HEAD)
  [ "$head" = "$v291" ] || echo "warning: HEAD is $head, not v2.9.1 ($v291)"
  if git -C "$pytorch" apply --reverse --check "$patch" >/dev/null 2>&1; then
    echo "the patch is already applied to $pytorch"
    return 0
  fi
  if ! "$repo/scripts/apply_patch.sh" --pytorch "$pytorch"; then
    echo "The tree is not pristine v2.9.1 (or holds another version of this patch)."
    echo "To start over (this discards local changes in $pytorch):"
    echo "  git -C $pytorch checkout -f $v291 && git -C $pytorch clean -fd"
    return 1
  fi
  "$repo/scripts/apply_patch.sh" --pytorch "$pytorch" --apply
}

build_pytorch() {
  # USE_DISTRIBUTED and BUILD_TEST are off unless set by the caller: the
  # suite needs neither, and they lengthen the build.
  cd "$pytorch" &&
    git submodule sync --recursive &&
    git submodule update --init --recursive &&
    "$python" -m pip install -r requirements.txt &&
    USE_MPS=1 USE_CUDA=0 USE_DISTRIBUTED=${USE_DISTRIBUTED:-0} BUILD_TEST=${BUILD_TEST:-0} MAX_JOBS=$jobs \
      "$python" -m pip install --no-build-isolation -v -e .
}

check_torch() {
  # Run outside the source tree so that the installed torch is what is imported.
  cd "$out" && PYTORCH_DIR="$pytorch" "$python" - <<'EOF'
import os
import torch

print("torch", torch.__version__, "git", torch.version.git_version, "from", torch.__file__)
if not os.path.realpath(torch.__file__).startswith(os.path.realpath(os.environ["PYTORCH_DIR"]) + os.sep):
    print("warning: this torch was not imported from PYTORCH_DIR")
if not torch.backends.mps.is_available():
    raise SystemExit("MPS is not available: not built with USE_MPS=1, or not an Apple Silicon Mac")
if not hasattr(torch.mps, "release_current_thread_slot"):
    raise SystemExit("this torch has no MPS stream pool: was it built from the patched tree?")
EOF
}

run_tests() {
  cd "$pytorch" && "$python" test/test_mps_parallel.py -v
}

harness() { # harness PRESET
  command -v cmake >/dev/null || { echo "cmake not found: brew install cmake googletest google-benchmark"; return 1; }
  cd "$repo" &&
    cmake --preset "$1" &&
    cmake --build --preset "$1" -j "$jobs" &&
    ctest --preset "$1" -j "$jobs"
}

bench() {
  local args=(--python "$python" --out "$out/bench" --label patched)
  [ "$quick_bench" -eq 1 ] && args+=(--quick)
  "$here/run_mps_benchmarks.sh" "${args[@]}"
}

if ! step apply-patch apply_patch; then
  summary
  exit 1
fi
if [ "$skip_build" -eq 0 ] && ! step build build_pytorch; then
  summary
  exit 1
fi
if ! step check-torch check_torch; then
  summary
  exit 1
fi
step test_mps_parallel run_tests
if [ "$skip_harness" -eq 0 ]; then
  step harness-dev harness dev
  [ "$tsan" -eq 1 ] && step harness-tsan harness tsan
fi
[ "$skip_bench" -eq 0 ] && step bench bench
summary
exit "$failed"
