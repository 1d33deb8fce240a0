#!/usr/bin/env bash
# Installs what a fresh Debian (bookworm) machine lacks, from Debian packages.
set -euo pipefail
pkgs=(cmake make g++ clang libclang-rt-14-dev clang-format git
      libgtest-dev libgmock-dev libbenchmark-dev
      python3 python3-torch python3-pytest flake8 shellcheck
      # scripts/compile_check.sh: Foundation from GNUstep, GCC's Objective-C
      # runtime headers, blocks, libc++ (as Apple's toolchain), Python.h, pip.
      libgnustep-base-dev gnustep-make libobjc-12-dev libblocksruntime-dev
      libc++-14-dev libc++abi-14-dev python3-dev python3-pip
      # tests/model: the SPIN model checker.
      spin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  $sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
