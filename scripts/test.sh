#!/usr/bin/env bash
# Runs every test suite of the repository; exits non-zero if any fails.
#   scripts/test.sh [--quick]     (--quick: dev preset only, no sanitizers)
# Suites: the CTest harness under the dev, tsan and asan presets and, built
# with GCC, the gcc preset; the glue tests (scripts/glue_tests.sh) in the
# dev, tsan and asan variants; the BatchQueue tests
# (Debian's CPU torch, system python); flake8 and bash lint; clang-format; no
# copyright claims in added files; no added line naming a file outside
# PyTorch or v2.9.1; every cited Note defined; the SPIN models; the
# differential compile check; the patch-vs-overlay and series-vs-overlay
# checks; and, when the baseline cache exists, the patch apply check and the
# check that the series applied in order yields the cumulative patch's tree.
# The per-prefix compile check of the series is separate (scripts/series.py
# compile).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.." || exit 1
jobs=$(nproc)
passed=0 failed=0 failed_suites=()

record() { # record NAME STATUS [PASSED_COUNT FAILED_COUNT]
  local name=$1 status=$2 np=${3:-1} nf=${4:-0}
  if [ "$status" -ne 0 ] && [ "$nf" -eq 0 ]; then nf=1; fi
  passed=$((passed + np)); failed=$((failed + nf))
  if [ "$status" -ne 0 ]; then failed_suites+=("$name"); fi
  echo "== $name: $([ "$status" -eq 0 ] && echo ok || echo FAILED)"
}

ctest_suite() { # ctest_suite PRESET
  local preset=$1 log
  log=$(mktemp)
  echo "== building preset $preset"
  if ! { cmake --preset "$preset" >/dev/null && cmake --build --preset "$preset" -j"$jobs"; } \
      >"$log" 2>&1; then
    tail -50 "$log"; record "ctest[$preset] build" 1; return
  fi
  ctest --preset "$preset" -j"$jobs" 2>&1 | tee "$log" | grep -E "tests passed|Failed|\*\*\*"
  local st=${PIPESTATUS[0]}
  local total fails
  total=$(grep -oE "out of [0-9]+" "$log" | grep -oE "[0-9]+" | tail -1)
  fails=$(grep -oE "[0-9]+ tests failed" "$log" | grep -oE "^[0-9]+" | tail -1)
  total=${total:-0}; fails=${fails:-0}
  record "ctest[$preset]" "$st" $((total - fails)) "$fails"
}

presets=(dev tsan asan)
[ "${1:-}" = "--quick" ] && presets=(dev)
for p in "${presets[@]}"; do ctest_suite "$p"; done
# A second compiler: where Clang and GCC differ (argument evaluation order,
# for one), only running both shows it.
[ "${1:-}" = "--quick" ] || ctest_suite gcc

# The patched Objective-C++ glue on the simulated Metal runtime
# (reports/glue-on-linux.md), in the same variants. The patched .mm files are
# the v2.9.1 baseline plus the overlay's diffs, so without the baseline cache
# (../shared/baseline/README.md) there is nothing to build.
baseline=$HOME/.cache/pytorch-v2.9.1-mps-baseline
if [ -d "$baseline" ]; then
  log=$(mktemp)
  "$here/glue_tests.sh" "${presets[@]}" 2>&1 | tee "$log" |
    grep -E "^glue|tests passed|\*\*\*|FAILED|error"
  st=${PIPESTATUS[0]}
  np=0 nf=0
  while read -r a b; do np=$((np + a)); nf=$((nf + b)); done < <(
    sed -nE 's/^glue\[[a-z]+\]: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/p' "$log")
  record "glue" "$st" "$np" "$nf"
else
  echo "== baseline cache $baseline absent: SKIPPING the glue tests"
fi

log=$(mktemp)
/usr/bin/python3 -m pytest -q tests/python 2>&1 | tee "$log" | tail -3
st=${PIPESTATUS[0]}
np=$(grep -oE "[0-9]+ passed" "$log" | grep -oE "[0-9]+" | tail -1)
nf=$(grep -oE "[0-9]+ failed" "$log" | grep -oE "[0-9]+" | tail -1)
record "pytest" "$st" "${np:-0}" "${nf:-0}"

py_files=$(git ls-files '*.py')
/usr/bin/python3 -m flake8 --max-line-length 120 $py_files; record "flake8" $?
sh_files=$(git ls-files '*.sh' .ci/run)
bash_ok=0
for f in $sh_files; do bash -n "$f" || bash_ok=1; done
if command -v shellcheck >/dev/null; then shellcheck -S warning $sh_files || bash_ok=1; fi
record "bash lint" $bash_ok

cxx_files=$(git ls-files '*.h' '*.cpp' | grep -v '^tests/shim/' | grep -v '^tests/compile/')
clang-format --dry-run -Werror $cxx_files; record "clang-format" $?

# Files this patch adds claim no one's copyright (upstream files keep theirs).
new_files=$(git ls-files fork-overlay | grep -v '\.diff$')
! grep -l "Copyright" $new_files; record "no copyright claims in added files" $?
# Comments and messages the patch adds make sense in PyTorch's tree once it
# lands: they name no file of this repository or of ../shared, and no release
# they were compared against.
patch=patches/cumulative-v2.9.1-to-mps-stream-pool.patch
! grep -nE '^\+.*(\b(reports|tests|fork-overlay|patches)/|METAL-SEMANTICS|v2\.9)' "$patch"
record "no references to files outside PyTorch or to v2.9.1" $?
# Every Note [...] an added line cites is one the patch defines (a comment
# line holding only the Note's name), and no citation is split across lines,
# where neither this check nor a reader's grep would find it.
undefined=$(grep -E '^\+' "$patch" | grep -oE 'Note \[[^]]+\]' | sort -u | while read -r ref; do
  grep -qxE "\+ *// ${ref//[/\\[}" "$patch" || echo "$ref"; done)
[ -z "$undefined" ] || echo "cited but not defined: $undefined"
! grep -nE '^\+.*\bNote( \[[^]]*)?$' "$patch" && [ -z "$undefined" ]
record "every cited Note is defined" $?

# Model checks (SPIN): the cross-stream dependency protocol and the
# stream-slot leases.
for model in stream_dependencies stream_lease; do
  log=$(mktemp)
  "tests/model/run_$model.sh" 2>&1 | tee "$log"
  st=${PIPESTATUS[0]}
  record "model $model" "$st" \
    "$(grep -c ": 0 errors" "$log")" "$(grep -c "FAILED" "$log")"
done

# Differential compile check of the Objective-C++ half against v2.9.1's
# headers (reports/compile-check.md).
log=$(mktemp)
scripts/compile_check.sh 2>&1 | tee "$log" | grep -vE "^  |^$"
st=${PIPESTATUS[0]}
last=$(grep -E "^compile-check: " "$log" | tail -1)
np=$(grep -oE "[0-9]+ passed" <<<"$last" | grep -oE "[0-9]+")
nf=$(grep -oE "[0-9]+ failed" <<<"$last" | grep -oE "[0-9]+")
record "compile check" "$st" "${np:-0}" "${nf:-0}"

"$here/regenerate_cumulative_patch.sh" --check; record "patch matches overlay" $?
python3 "$here/series.py" check; record "series matches overlay" $?

if [ -d "$baseline" ]; then
  "$here/apply_patch.sh"; record "patch applies to v2.9.1 baseline" $?
  "$here/apply_patch.sh" --series; record "series composes to the cumulative patch" $?
else
  echo "== baseline cache $baseline absent: skipping the patch apply check"
fi

if [ "${#failed_suites[@]}" -gt 0 ]; then
  echo "failed suites: ${failed_suites[*]}"
fi
echo "summary: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
