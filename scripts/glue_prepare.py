#!/usr/bin/env python3
"""Inputs of the glue test build (tests/glue, reports/glue-on-linux.md).

  - the Linux x86_64 torch==2.9.1 wheel (tests/compile/wheel-linux.tsv):
    downloaded when absent, sha256-checked, and only torch/include,
    libc10.so, libtorch_cpu.so and libgomp.so.1 unpacked into
    ~/.cache/mps-glue/torch-2.9.1-linux; its libc10.so must have the C++11
    string ABI that the glue is compiled with;
  - the patched tree: scripts/overlay.py materialize of the overlay into
    OUT/tree, rewriting only files whose text changed so that a rebuild
    compiles only what changed;
  - the v2.9-era upstream sources the link needs (tests/glue/upstream.tsv),
    read from the public code index into ~/.cache/pytorch-v2.9-mps-glue-upstream,
    checked by size and git blob SHA-1.

Writes OUT/glue-paths.cmake for tests/glue/CMakeLists.txt (-DGLUE_PATHS=...).
"""

import argparse
import contextlib
import filecmp
import hashlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile

import torch_wheel
from torch_wheel import HOME_CACHE, SetupError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL_TSV = os.path.join(ROOT, "tests", "compile", "wheel-linux.tsv")
PIP_PLATFORM = "manylinux_2_28_x86_64"
TORCH_CACHE = os.path.join(HOME_CACHE, "mps-glue", "torch-2.9.1-linux")
# libtorch_cpu.so needs libgomp.so.1 from the same directory (its RPATH has
# $ORIGIN); its CUDA dependencies are stubbed (tests/glue/standins).
LIBS = ("libc10.so", "libtorch_cpu.so", "libgomp.so.1")
UPSTREAM_TSV = os.path.join(ROOT, "tests", "glue", "upstream.tsv")
UPSTREAM_DIR = os.path.join(HOME_CACHE, "pytorch-v2.9-mps-glue-upstream")
DEFAULT_BASELINE = os.path.join(HOME_CACHE, "pytorch-v2.9.1-mps-baseline")
# Mangled `std::__cxx11::basic_string`: present only in a C++11-ABI build.
CXX11_STRING = b"NSt7__cxx1112basic_string"


def select(name):
    if name.startswith("torch/include/"):
        return "include/" + name[len("torch/include/"):]
    lib = name[len("torch/lib/"):] if name.startswith("torch/lib/") else None
    return "lib/" + lib if lib in LIBS else None


def torch_dir():
    wheel, sha = torch_wheel.fetch(WHEEL_TSV, PIP_PLATFORM)
    dest = torch_wheel.unpack(wheel, sha, TORCH_CACHE, select)
    with open(os.path.join(dest, "lib", "libc10.so"), "rb") as f:
        if CXX11_STRING not in f.read():
            raise SetupError("the wheel's libc10.so is not built with the C++11 string ABI")
    return dest


def materialize(overlay, baseline, out):
    spec = importlib.util.spec_from_file_location("overlay", os.path.join(ROOT, "scripts", "overlay.py"))
    ov = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ov)
    ov.OVERLAY = os.path.abspath(overlay)
    if not os.path.isdir(baseline):
        raise SetupError(f"no v2.9.1 baseline at {baseline}: see ../shared/baseline/README.md")
    scratch = tempfile.mkdtemp(prefix="glue-tree-")
    try:
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                ov.cmd_materialize(argparse.Namespace(pytorch=baseline, out=os.path.join(scratch, "t")))
        except SystemExit:
            raise SetupError("scripts/overlay.py materialize failed:\n" + log.getvalue())
        src = os.path.join(scratch, "t")
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames[:] = [d for d in dirnames if d != ".git"]
            for name in filenames:
                rel = os.path.relpath(os.path.join(dirpath, name), src)
                dst = os.path.join(out, rel)
                if os.path.isfile(dst) and filecmp.cmp(os.path.join(src, rel), dst, shallow=False):
                    continue
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(os.path.join(src, rel), dst)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_upstream():
    """The upstream texts the build compiles, as tests/glue/upstream.tsv pins them."""
    with open(UPSTREAM_TSV, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    header, rows = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    for row in rows:
        if row[col["built"]] != "yes":
            continue
        path = os.path.join(UPSTREAM_DIR, row[col["path"]])
        if not os.path.isfile(path):
            raise SetupError(f"{path} absent: read index id {row[col['index_id']]} as tests/glue/upstream.tsv says")
        with open(path, "rb") as f:
            data = f.read()
        chars = len(data.decode("utf-8"))
        sha = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        if chars != int(row[col["chars"]]) or sha != row[col["git_blob_sha1"]]:
            raise SetupError(f"{path}: {chars} chars, blob {sha}; tests/glue/upstream.tsv pins "
                             f"{row[col['chars']]} chars, blob {row[col['git_blob_sha1']]}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="build directory shared by the variants")
    p.add_argument("--overlay", default=os.path.join(ROOT, "fork-overlay"))
    p.add_argument("--baseline", default=DEFAULT_BASELINE)
    args = p.parse_args()
    out = os.path.abspath(args.out)
    try:
        torch = torch_dir()
        materialize(args.overlay, os.path.abspath(args.baseline), os.path.join(out, "tree"))
        check_upstream()
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(os.path.join(out, "glue-paths.cmake"), "w", encoding="utf-8") as f:
        f.write(f'set(GLUE_TREE "{os.path.join(out, "tree")}")\n'
                f'set(TORCH_INCLUDE "{os.path.join(torch, "include")}")\n'
                f'set(TORCH_LIB "{os.path.join(torch, "lib")}")\n'
                f'set(GLUE_UPSTREAM "{UPSTREAM_DIR}")\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
