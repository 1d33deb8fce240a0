#!/usr/bin/env python3
"""Differential compile check of the patch against PyTorch v2.9.1's headers.

Every translation unit the overlay touches is compiled with clang
(-fsyntax-only) twice: as PyTorch v2.9.1 has it (baseline) and with the patch
applied (patched), against the headers of the official torch==2.9.1 macOS
arm64 wheel, Debian's GNUstep Foundation, and declaration-only stand-ins for
Apple's frameworks (tests/compile/sdk). A unit fails when the patched compile
has a diagnostic the baseline compile has not; new files and headers must
compile without any diagnostic. reports/compile-check.md says what this
proves and what it cannot.

The last line is `compile-check: N passed, M failed, K skipped`; the exit
status is 0 only when nothing failed.
"""

import argparse
import collections
import concurrent.futures
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import torch_wheel
from torch_wheel import HOME_CACHE, SetupError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL_TSV = os.path.join(ROOT, "tests", "compile", "wheel.tsv")
INCLUDE_CACHE = os.path.join(HOME_CACHE, "mps-compile-check", "torch-2.9.1-macos-include")
DEFAULT_BASELINE = os.path.join(HOME_CACHE, "pytorch-v2.9.1-mps-baseline")
BASELINE_README = "../shared/baseline/README.md"
CALLERS_TSV = os.path.join(ROOT, "tests", "compile", "callers.tsv")
DEFAULT_CALLERS = os.path.join(HOME_CACHE, "pytorch-v2.9-mps-callers-resolved")
SDK_DIR = os.path.join(ROOT, "tests", "compile", "sdk")
SHIM_DIR = os.path.join(ROOT, "tests", "compile", "shim")
PIP_PLATFORM = "macosx_11_0_arm64"

# CMAKE_CXX_FLAGS of the torch 2.9.1 macOS arm64 wheel, verbatim as its
# libtorch_cpu.dylib embeds them (its build-settings string); check_flags()
# confirms the wheel at hand still contains exactly this text.
PYTORCH_CXX_FLAGS = (
    " -fvisibility-inlines-hidden -DUSE_PTHREADPOOL -DNDEBUG -DUSE_KINETO -DLIBKINETO_NOCUPTI"
    " -DLIBKINETO_NOROCTRACER -DLIBKINETO_NOXPUPTI=ON -DUSE_PYTORCH_QNNPACK -DAT_BUILD_ARM_VEC256_WITH_SLEEF"
    " -DUSE_XNNPACK -DUSE_PYTORCH_METAL_EXPORT -DSYMBOLICATE_MOBILE_DEBUG_HANDLE -DUSE_COREML_DELEGATE -O2"
    " -fPIC -DC10_NODEPRECATED -Wall -Wextra -Werror=return-type -Werror=non-virtual-dtor"
    " -Werror=braced-scalar-init -Werror=range-loop-construct -Werror=bool-operation -Wnarrowing"
    " -Wno-missing-field-initializers -Wno-unknown-pragmas -Wno-unused-parameter -Wno-strict-overflow"
    " -Wno-strict-aliasing -Wvla-extension -Wsuggest-override -Wnewline-eof -Winconsistent-missing-override"
    " -Winconsistent-missing-destructor-override -Wno-pass-failed -Wno-error=old-style-cast"
    " -Wconstant-conversion -Qunused-arguments -faligned-new -fno-math-errno -fno-trapping-math"
    " -Werror=format -DUSE_MPS -Wno-missing-braces")
# PyTorch's top-level CMakeLists.txt, if(APPLE) if(USE_MPS): CMAKE_OBJCXX_FLAGS
# gets -DUSE_MPS -fno-objc-arc and -Wno-unguarded-availability-new
# (-DC10_NODEPRECATED is appended for every language).
PYTORCH_OBJCXX_FLAGS = ["-DC10_NODEPRECATED", "-DUSE_MPS", "-fno-objc-arc", "-Wno-unguarded-availability-new"]
# Target definitions: torch_cpu (ATen) builds with per-operator headers
# (USE_PER_OPERATOR_HEADERS defaults ON) as its main library; torch_python
# (torch/csrc) as its own.
TARGET_DEFINES = {"aten": ["-DAT_PER_OPERATOR_HEADERS", "-DCAFFE2_BUILD_MAIN_LIB"],
                  "torch": ["-DAT_PER_OPERATOR_HEADERS", "-DTHP_BUILD_MAIN_LIB"]}
# PyTorch builds with -std=c++17 (CMAKE_CXX_STANDARD 17). Apple's clang uses
# libc++ and enables blocks in every language; Linux clang needs both asked
# for. -Wthread-safety is the project's own lock-annotation check.
COMMON_FLAGS = ["-fsyntax-only", "-std=c++17", "-stdlib=libc++", "-fblocks", "-fno-color-diagnostics",
                "-fdiagnostics-show-option", "-ferror-limit=0", "-Wthread-safety"]
# gcc's Objective-C runtime has no object subscripting (dict[key]), which
# the v2.9.1 sources use; gnustep-2.0 is the GNU-family runtime with
# subscripting, literals and the non-fragile ABI, as Apple's runtime has.
OBJC_RUNTIME = "-fobjc-runtime=gnustep-2.0"

OBJC_SYNTAX = re.compile(r"@(interface|protocol|class|end|autoreleasepool|selector|available)\b|\bid<|#\s*import\b"
                         r"|\^\s*[({]|__OBJC__")
DIAG = re.compile(r"^(?P<file>.*?):(?P<line>\d+):(?P<col>\d+): (?P<sev>fatal error|error|warning|note|remark): "
                  r"(?P<msg>.*)$")
DRIVER_DIAG = re.compile(r"^(clang|clang\+\+)[-\d.]*: (?P<sev>error|warning): (?P<msg>.*)$")
INCLUDE_STACK = re.compile(r"^(In file included from |\s+from ).*:\d+:$")
CALLER_SKIP = re.compile(r"baseline does not compile: [^;]+")
SUMMARY = re.compile(r"^\d+ (warning|error)s? (and \d+ (warning|error)s? )?generated\.$")


def objcxx_warning_flags(cxx_flags):
    """PYTORCH_CXX_FLAGS as an Objective-C++ unit gets them here: each
    -Werror=X becomes -WX. v2.9.1 compiles .mm files as CMake's OBJCXX
    language (caffe2/CMakeLists.txt: enable_language(OBJC OBJCXX) under
    USE_MPS), whose flags are CMAKE_OBJCXX_FLAGS only, so none of the
    CMAKE_CXX_FLAGS errors applies to them; the warnings are kept so that
    the differential verdict still sees them."""
    return ["-W" + f[len("-Werror="):] if f.startswith("-Werror=") else f for f in cxx_flags.split()]


# --- The wheel ----------------------------------------------------------------

def fetch_wheel():
    return torch_wheel.fetch(WHEEL_TSV, PIP_PLATFORM)


def unpack_includes(wheel, sha):
    """torch/include of the wheel, unpacked once into ~/.cache."""
    prefix = "torch/include/"
    return torch_wheel.unpack(wheel, sha, INCLUDE_CACHE,
                              lambda name: name[len(prefix):] if name.startswith(prefix) else None)


def check_flags(wheel, sha):
    """Confirms PYTORCH_CXX_FLAGS is the flag string the wheel was built with."""
    stamp = os.path.join(INCLUDE_CACHE, ".flags-checked")
    if os.path.isfile(stamp) and open(stamp, encoding="utf-8").read().strip() == sha:
        return
    needle = b"\0" + PYTORCH_CXX_FLAGS.encode() + b"\0"
    found, tail = False, b""
    with zipfile.ZipFile(wheel) as z, z.open("torch/lib/libtorch_cpu.dylib") as lib:
        for chunk in iter(lambda: lib.read(1 << 22), b""):
            if needle in tail + chunk:
                found = True
                break
            tail = chunk[-len(needle):]
    if not found:
        raise SetupError("torch/lib/libtorch_cpu.dylib in the wheel does not embed the CXX_FLAGS "
                         "string in scripts/compile_check.py")
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(sha + "\n")


# --- The two trees --------------------------------------------------------------

def load_overlay(overlay_dir):
    spec = importlib.util.spec_from_file_location("overlay", os.path.join(ROOT, "scripts", "overlay.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.OVERLAY = os.path.abspath(overlay_dir)
    return mod


def quietly(fn, *args):
    """Runs an overlay.py command, turning its exit into a SetupError."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return fn(*args)
    except SystemExit:
        raise SetupError((err.getvalue() or out.getvalue()).strip())


def wheel_path(include, repo_path):
    """Where the wheel keeps a header of the PyTorch tree, or None."""
    for prefix, sub in (("aten/src/", ""), ("torch/csrc/", "torch/csrc/")):
        if repo_path.startswith(prefix):
            return os.path.join(include, sub + repo_path[len(prefix):])
    return None


def build_trees(ov, baseline, include, work):
    """(baseline tree, patched tree, full?) as directories."""
    patched = os.path.join(work, "patched")
    if os.path.isdir(baseline):
        quietly(ov.cmd_materialize, argparse.Namespace(pytorch=baseline, out=patched))
        return baseline, patched, True
    # Without the rebuilt baseline, the edited headers still exist verbatim
    # in the wheel; their blob SHAs prove they are v2.9.1's.
    shas = ov.read_upstream_shas()
    partial = os.path.join(work, "baseline-from-wheel")
    keep = []
    for path in ov.edited_paths():
        src = wheel_path(include, path) if path.endswith(".h") else None
        if not src or not os.path.isfile(src):
            continue
        with open(src, "rb") as f:
            data = f.read()
        if ov.blob_sha(data) != shas.get(path):
            raise SetupError(f"the wheel's {path} is not the v2.9.1 blob {shas.get(path)}")
        dst = os.path.join(partial, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)
        keep.append(path)
    shutil.copytree(partial, patched)
    sections = quietly(ov.sections)
    text = "".join(s for p, s in sections.items() if p in keep or "\nnew file mode " in s.split("@@", 1)[0])
    patch = os.path.join(work, "partial.patch")
    with open(patch, "w", encoding="utf-8") as f:
        f.write(text)
    res = subprocess.run(["git", "apply", "--whitespace=nowarn", patch], cwd=patched, capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise SetupError("git apply of the header and new-file sections failed:\n" + res.stderr)
    return partial, patched, False


# --- Units ------------------------------------------------------------------------

class Unit:
    """One compile check: a source or header, in one language."""

    def __init__(self, path, kind, lang, defines=()):
        self.path, self.kind, self.lang, self.defines = path, kind, lang, list(defines)
        self.source = path  # relative to the tree, or absolute (callers)
        self.name = path if kind.endswith("tu") else f"{path} [{lang}]"
        if defines:
            self.name += " [" + " ".join(defines) + "]"
        self.results = {}
        self.verdict, self.reason, self.new = None, "", []
        self.skip = ""  # callers.tsv: why this caller is not compiled


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_langs(text):
    code = strip_comments(text)
    if "__OBJC__" in code:
        return ["objc++", "c++"]
    return ["objc++"] if OBJC_SYNTAX.search(code) else ["c++"]


def list_callers(callers_dir, skipped):
    """Untouched v2.9-era files that use the APIs the patch changes
    (tests/compile/callers.tsv): compiled as they are against the baseline
    and the patched headers. A caller whose note says "baseline does not
    compile: <reason>" is not compiled and is reported SKIPPED with that
    reason, so that the verdict rests only on callers that compile. Paths in
    `skipped` (callers the overlay edits) are units of list_units()."""
    units = []
    with open(CALLERS_TSV, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or line.startswith("path\t") or not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            path = cols[0]
            if path in skipped:
                continue
            u = Unit(path, "caller-tu", "objc++" if path.endswith(".mm") else "c++")
            u.source = os.path.join(callers_dir, path)
            m = CALLER_SKIP.search(cols[7] if len(cols) > 7 else "")
            if m:
                u.skip = m.group(0).strip()
            units.append(u)
    return units


def list_units(ov, patched, jit_shaders, unchanged):
    """Units of the overlay's files, and of `unchanged` (upstream files the
    overlay leaves as v2.9.1 has them), checked as edited ones."""
    units = []
    entries = [(path, is_edit) for path, _full, is_edit in quietly(ov.overlay_entries)]
    for path, is_edit in entries + [(path, True) for path in unchanged]:
        ext = os.path.splitext(path)[1]
        if ext in (".mm", ".cpp"):
            lang = "objc++" if ext == ".mm" else "c++"
            kind = "edited-tu" if is_edit else "new-tu"
            units.append(Unit(path, kind, lang))
            src = os.path.join(patched, path)
            with open(src if os.path.isfile(src) else os.devnull, encoding="utf-8") as f:
                if jit_shaders and "_metallib.h>" in f.read():
                    # The build-generated shader header is included only in
                    # this configuration (tests/compile/sdk stands in for it).
                    units.append(Unit(path, kind, lang, ["-DPYTORCH_JIT_COMPILE_SHADERS"]))
        elif ext == ".h":
            if is_edit:
                # Every edited header is part of the Objective-C++ backend; it
                # is also checked as C++ where v2.9.1's compiles as C++.
                units += [Unit(path, "edited-header", "objc++"), Unit(path, "edited-header", "c++")]
            else:
                with open(os.path.join(patched, path), encoding="utf-8") as f:
                    units += [Unit(path, "new-header", lang) for lang in header_langs(f.read())]
    return units


# --- Compiling ----------------------------------------------------------------

def gnustep_flags():
    try:
        out = subprocess.run(["gnustep-config", "--objc-flags"], capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        raise SetupError("gnustep-config not found: run scripts/install_deps.sh (libgnustep-base-dev)")
    flags = []
    for tok in out:
        if tok.startswith("-I") and tok != "-I.":
            flags += ["-isystem", tok[2:]]
        elif tok.startswith("-D") or tok.startswith("-fconstant-string-class=") or tok in (
                "-fobjc-exceptions", "-fexceptions"):
            flags.append(tok)
    return flags


def gcc_objc_include():
    """GCC's Objective-C runtime headers (libobjc-*-dev), searched last."""
    root = "/usr/lib/gcc"
    for dirpath, dirnames, _ in sorted(os.walk(root), reverse=True):
        if os.path.isfile(os.path.join(dirpath, "objc", "objc.h")):
            return dirpath
        dirnames[:] = [d for d in dirnames if d not in ("plugin", "install-tools")]
    raise SetupError("GCC's <objc/objc.h> not found: run scripts/install_deps.sh (libobjc-12-dev)")


def python_include():
    for d in ("/usr/include/python3.11",):
        if os.path.isfile(os.path.join(d, "Python.h")):
            return d
    return None


def tree_digest(tree):
    """sha256 of every path and content under tree (its .git aside: materialize's commit)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        files += [os.path.join(dirpath, name) for name in filenames]
    h = hashlib.sha256()
    for full in sorted(files):
        h.update(os.path.relpath(full, tree).encode() + b"\0")
        with open(full, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


class Compiler:
    def __init__(self, include, cache=None):
        self.include = include
        # --cache: results keyed by command, input, tree contents and the
        # stand-in headers, for runs that share a tree (the baseline side of
        # scripts/series.py compile).
        self.cache, self.digests = cache, {}
        self.standins = (tree_digest(SDK_DIR), tree_digest(SHIM_DIR)) if cache else None
        self.objc = [OBJC_RUNTIME] + PYTORCH_OBJCXX_FLAGS + ["-I", SHIM_DIR] + gnustep_flags() + [
            "-idirafter", gcc_objc_include()]
        self.python = python_include()

    def command(self, path, lang, header, defines=(), source=None):
        target = "torch" if path.startswith("torch/") else "aten"
        cmd = ["clang++", "-x", "objective-c++" if lang == "objc++" else "c++"] + COMMON_FLAGS + list(defines)
        cmd += (objcxx_warning_flags(PYTORCH_CXX_FLAGS) if lang == "objc++" else PYTORCH_CXX_FLAGS.split())
        cmd += TARGET_DEFINES[target]
        if lang == "objc++":
            cmd += self.objc
        cmd += ["-I", "aten/src", "-I", ".", "-I", self.include,
                "-I", os.path.join(self.include, "torch", "csrc", "api", "include"), "-isystem", SDK_DIR]
        if target == "torch" and self.python:
            cmd += ["-isystem", self.python]
        return cmd + (["-"] if header else [source or path])

    def run(self, tree, path, lang, header, defines=(), source=None):
        cmd = self.command(path, lang, header, defines, source)
        stdin = f"#include <{path.split('aten/src/', 1)[-1]}>\n" if header else None
        stored = None
        if self.cache:
            if tree not in self.digests:
                self.digests[tree] = tree_digest(tree)
            key = hashlib.sha256(repr((cmd, stdin, self.digests[tree], self.standins)).encode()).hexdigest()
            stored = os.path.join(self.cache, key + ".json")
            if os.path.isfile(stored):
                with open(stored, encoding="utf-8") as f:
                    return json.load(f)
        res = subprocess.run(cmd, cwd=tree, input=stdin, capture_output=True, text=True)
        records = parse(res.stderr + res.stdout)
        if stored:
            with tempfile.NamedTemporaryFile("w", dir=self.cache, delete=False, encoding="utf-8") as f:
                json.dump(records, f)
            os.replace(f.name, stored)
        return records


def parse(output):
    """Diagnostics as records: severity, file, message, source line, text."""
    records, pending, cur = [], [], None
    for line in output.splitlines():
        m = DIAG.match(line)
        d = None if m else DRIVER_DIAG.match(line)
        if INCLUDE_STACK.match(line):
            pending.append(line)
        elif (m and m.group("sev") == "note") and cur is not None:
            cur["text"] += pending + [line]
            pending = []
        elif m or d:
            g = (m or d).groupdict()
            cur = {"sev": g["sev"], "file": g.get("file", ""), "msg": g["msg"], "source": None,
                   "text": pending + [line]}
            pending = []
            records.append(cur)
        elif SUMMARY.match(line):
            cur = None
        elif cur is not None:
            if cur["source"] is None and len(cur["text"]) == 1 + sum(
                    1 for t in cur["text"] if INCLUDE_STACK.match(t)):
                cur["source"] = line.strip()
            cur["text"].append(line)
    return records


def key(rec):
    # Paths inside a tree are relative (clang runs in the tree), so the same
    # file has the same name in the baseline and the patched compile.
    return (rec["sev"], rec["file"], rec["msg"], rec["source"])


def new_diagnostics(base, patched):
    """Patched records whose (message, source text) the baseline lacks."""
    left = collections.Counter(key(r) for r in base)
    out = []
    for r in patched:
        k = key(r)
        if left[k] > 0:
            left[k] -= 1
        else:
            out.append(r)
    return out


def counts(records):
    e = sum(1 for r in records if r["sev"] in ("error", "fatal error"))
    return e, len(records) - e


def is_touched(rec, touched):
    return rec["file"] in touched or rec["file"] in ("-", "<stdin>", "")


# --- Verdicts -------------------------------------------------------------------

def judge(u, full, have_python, touched):
    if u.skip:
        u.verdict, u.reason = "SKIPPED", u.skip
        return
    if u.kind in ("edited-tu", "caller-tu") and not full:
        u.verdict, u.reason = "SKIPPED", f"no v2.9.1 baseline tree; see {BASELINE_README}"
        return
    if u.kind == "caller-tu" and not os.path.isfile(u.source):
        u.verdict, u.reason = "SKIPPED", f"{u.source} absent; see tests/compile/callers.tsv"
        return
    if u.path.startswith("torch/") and not have_python:
        u.verdict, u.reason = "SKIPPED", "Python.h not found; run scripts/install_deps.sh (python3-dev)"
        return
    if u.kind == "edited-header" and u.lang == "c++" and counts(u.results["baseline"])[0]:
        u.verdict, u.reason = "SKIPPED", "v2.9.1's header is Objective-C only"
        return
    patched = u.results["patched"]
    if u.kind == "edited-header" and not patched:
        u.verdict = "ok"
        return
    if u.kind in ("edited-tu", "edited-header", "caller-tu"):
        base = u.results["baseline"]
        be, _ = counts(base)
        if be:
            u.verdict, u.reason, u.new = "FAIL", f"baseline has {be} error(s): a stand-in lacks a declaration", [
                r for r in base if r["sev"] in ("error", "fatal error")]
            return
        u.new = new_diagnostics(base, patched)
        if u.kind == "edited-header":
            # The header itself must be clean, not only no worse than v2.9.1.
            u.new += [r for r in patched if r["file"] == u.path and r not in u.new]
    else:
        # New files: any diagnostic in the file itself or in a file the patch
        # adds or edits fails; ones in untouched v2.9.1 headers are counted.
        u.new = [r for r in patched if is_touched(r, touched)]
    u.verdict = "FAIL" if u.new else "ok"


def table(units):
    rows = [("unit", "baseline E/W", "patched E/W", "new", "verdict")]
    for u in units:
        b = u.results.get("baseline")
        p = u.results.get("patched")
        rows.append((u.name, "%d/%d" % counts(b) if b is not None else "-",
                     "%d/%d" % counts(p) if p is not None else "-",
                     str(len(u.new)) if u.verdict != "SKIPPED" else "-",
                     u.verdict + (f" ({u.reason})" if u.reason else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", metavar="SUBSTR", help="check only the units whose name contains SUBSTR")
    p.add_argument("--baseline", default=DEFAULT_BASELINE,
                   help=f"rebuilt v2.9.1 files (default {DEFAULT_BASELINE})")
    p.add_argument("--overlay", default=os.path.join(ROOT, "fork-overlay"),
                   help="overlay directory to check (default: fork-overlay/)")
    p.add_argument("--unchanged", metavar="PATH", action="append", default=[],
                   help="also check PATH, an upstream file of the baseline that the overlay does not edit, as an "
                   "edited unit against the patched headers (scripts/series.py compile: the files later members "
                   "edit)")
    p.add_argument("--callers", default=DEFAULT_CALLERS,
                   help=f"texts of the untouched callers in tests/compile/callers.tsv (default {DEFAULT_CALLERS})")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("-v", "--verbose", action="store_true", help="also print every baseline diagnostic")
    p.add_argument("--cache", metavar="DIR",
                   help="reuse compile results stored in DIR by earlier runs with the same wheel, stand-ins and "
                   "callers (scripts/series.py compile shares one across the series' prefixes)")
    p.add_argument("--jit-shaders", action="store_true",
                   help="also check the TUs that embed shader source under PYTORCH_JIT_COMPILE_SHADERS")
    args = p.parse_args()
    started = time.time()
    work = tempfile.mkdtemp(prefix="mps-compile-check-")
    try:
        wheel, sha = fetch_wheel()
        include = unpack_includes(wheel, sha)
        check_flags(wheel, sha)
        ov = load_overlay(args.overlay)
        base_tree, patched_tree, full = build_trees(ov, os.path.abspath(args.baseline), include, work)
        if full:
            for path in args.unchanged:
                os.makedirs(os.path.dirname(os.path.join(patched_tree, path)), exist_ok=True)
                shutil.copyfile(os.path.join(base_tree, path), os.path.join(patched_tree, path))
        units = list_units(ov, patched_tree, args.jit_shaders, args.unchanged) + list_callers(
            os.path.abspath(args.callers), set(quietly(ov.edited_paths)) | set(args.unchanged))
        compiler = Compiler(include, args.cache)
    except SetupError as e:
        shutil.rmtree(work, ignore_errors=True)
        print(f"error: {e}")
        print("compile-check: 0 passed, 1 failed, 0 skipped")
        return 2
    if args.only:
        units = [u for u in units if args.only in u.name]
    print(f"wheel: {os.path.basename(wheel)} (sha256 {sha[:16]}...), headers in {include}")
    print(f"baseline: {base_tree if full else 'headers from the wheel only (' + args.baseline + ' absent)'}")
    print(f"overlay: {os.path.abspath(args.overlay)}")
    touched = {p for p, _, _ in quietly(ov.overlay_entries)}

    # An edited header's baseline compile is needed only to judge patched
    # diagnostics, so it runs only when the patched compile has some; except
    # in C++, where it runs first and decides whether C++ applies at all.
    first = []
    for u in units:
        if u.kind in ("edited-tu", "caller-tu") and not full:
            continue
        if u.kind == "caller-tu" and (u.skip or not os.path.isfile(u.source)):
            continue
        if u.path.startswith("torch/") and not compiler.python:
            continue
        header = u.kind.endswith("header")
        if u.kind == "edited-header" and u.lang == "c++":
            first.append((u, "baseline", base_tree, header))
            continue
        first.append((u, "patched", patched_tree, header))
        if u.kind in ("edited-tu", "caller-tu"):
            first.append((u, "baseline", base_tree, header))
    # Longest compiles first so that the workers finish together.
    first.sort(key=lambda j: (j[3], -os.path.getsize(os.path.join(j[2], j[0].source))))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        pending = {pool.submit(compiler.run, tree, u.path, u.lang, header, u.defines, u.source): (u, side, header)
                   for u, side, tree, header in first}
        while pending:
            done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                u, side, header = pending.pop(fut)
                u.results[side] = fut.result()
                if u.kind != "edited-header" or ("patched" in u.results and "baseline" in u.results):
                    continue
                if side == "patched" and u.results[side]:
                    pending[pool.submit(compiler.run, base_tree, u.path, u.lang, True)] = (u, "baseline", True)
                elif side == "baseline" and not counts(u.results[side])[0]:
                    pending[pool.submit(compiler.run, patched_tree, u.path, u.lang, True)] = (u, "patched", True)
    shutil.rmtree(work, ignore_errors=True)

    for u in units:
        judge(u, full, compiler.python is not None, touched)
    for u in units:
        if u.new:
            print(f"\n== {u.name}: {u.reason or 'diagnostics the baseline does not have'}")
            for r in u.new:
                print("\n".join(r["text"]))
        if args.verbose and u.results.get("baseline"):
            print(f"\n-- {u.name}: baseline diagnostics")
            for r in u.results["baseline"]:
                print("\n".join(r["text"]))
    distinct = collections.OrderedDict()
    for u in units:
        for r in u.new:
            distinct.setdefault((r["file"], r["msg"], r["source"]), r)
    if distinct:
        print(f"\n== {len(distinct)} distinct new diagnostic(s):")
        for r in distinct.values():
            print(next(t for t in r["text"] if DIAG.match(t) or DRIVER_DIAG.match(t)))
    print()
    table(units)
    passed = sum(u.verdict == "ok" for u in units)
    failed = sum(u.verdict == "FAIL" for u in units)
    skipped = sum(u.verdict == "SKIPPED" for u in units)
    print(f"time: {time.time() - started:.0f} s with -j{args.jobs}")
    print(f"compile-check: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
