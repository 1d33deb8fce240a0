#!/usr/bin/env bash
# Builds and runs the glue tests (tests/glue, reports/glue-on-linux.md): the
# patched Objective-C++ MPS files against the simulated Metal runtime.
#   scripts/glue_tests.sh [VARIANT...]   VARIANT: dev (default), asan, tsan
# Each variant builds in build/glue-VARIANT; the inputs (wheel, patched tree)
# are prepared once in build/glue. Extra ctest arguments: GLUE_CTEST_ARGS.
# Prints `glue[VARIANT]: N passed, M failed` per variant and the seconds its
# build and run took; the exit status is non-zero when any variant failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
jobs=${GLUE_JOBS:-$(nproc)}
variants=("$@")
[ "${#variants[@]}" -gt 0 ] || variants=(dev)

if ! "${PYTHON:-python3}" "$here/glue_prepare.py" --out "$root/build/glue"; then
  echo "glue: preparing the inputs failed"
  exit 2
fi

status=0
for v in "${variants[@]}"; do
  case $v in
    dev) san="" ;;
    asan) san=address ;;
    tsan) san=thread ;;
    *) echo "unknown variant $v (dev, asan, tsan)"; exit 2 ;;
  esac
  dir=$root/build/glue-$v
  start=$(date +%s)
  if ! cmake -S "$root/tests/glue" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER="$(command -v clang)" -DCMAKE_CXX_COMPILER="$(command -v clang++)" \
      -DCMAKE_OBJCXX_COMPILER="$(command -v clang++)" \
      -DGLUE_PATHS="$root/build/glue/glue-paths.cmake" -DMPS_SANITIZER="$san" >/dev/null ||
     ! cmake --build "$dir" -j"$jobs"; then
    echo "glue[$v]: build FAILED"
    status=1
    continue
  fi
  built=$(date +%s)
  log=$dir/ctest.log
  # shellcheck disable=SC2086
  ctest --test-dir "$dir" -L glue -j"$jobs" --output-on-failure ${GLUE_CTEST_ARGS:-} 2>&1 | tee "$log"
  st=${PIPESTATUS[0]}
  done_=$(date +%s)
  total=$(grep -oE "out of [0-9]+" "$log" | grep -oE "[0-9]+" | tail -1)
  fails=$(grep -oE "[0-9]+ tests failed" "$log" | grep -oE "^[0-9]+" | tail -1)
  total=${total:-0}; fails=${fails:-0}
  [ "$st" -eq 0 ] && [ "$total" -gt 0 ] || status=1
  echo "glue[$v]: $((total - fails)) passed, $fails failed (build $((built - start)) s, run $((done_ - built)) s)"
done
exit $status
