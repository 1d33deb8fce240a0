#!/usr/bin/env python3
"""Turns fork-overlay/ into the cumulative patch, and back.

fork-overlay/ mirrors the PyTorch tree. A file there is either
  - a new file, kept in full, or
  - an edit to an upstream file, kept as `<upstream path>.diff`: a git-style
    unified diff against PyTorch v2.9.1 (a/ and b/ prefixes).

Subcommands:
  generate [--out F]     write the cumulative patch (stdout by default)
  check                  exit 1 if patches/ is stale, naming the files
  materialize --out DIR  baseline + overlay into a scratch git tree to edit
  capture --scratch DIR  read a scratch tree's edits back into the overlay
  verify [--apply]       check a PyTorch tree's blob SHAs, git apply --check,
                         and with --apply apply the patch

No command but verify/materialize needs the v2.9.1 baseline.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERLAY = os.path.join(ROOT, "fork-overlay")
PATCH = os.path.join(ROOT, "patches", "cumulative-v2.9.1-to-mps-stream-pool.patch")
UPSTREAM_SHAS = os.path.join(ROOT, "patches", "upstream-blobs.tsv")
DEFAULT_BASELINE = os.path.join(
    os.path.expanduser("~"), ".cache", "pytorch-v2.9.1-mps-baseline")
# The baseline kit rebuilds 23 files. An edited file beyond them is the text
# scripts/index_reads.py saved from the public index (tests/compile/callers.tsv),
# taken into the baseline cache only when it has the v2.9.1 blob SHA that
# patches/upstream-blobs.tsv pins.
INDEX_READS = os.path.join(
    os.path.expanduser("~"), ".cache", "pytorch-v2.9-mps-callers-resolved")
DIFF_SUFFIX = ".diff"


def fail(msg):
    sys.stderr.write(f"error: {msg}\n")
    sys.exit(1)


def blob_sha(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def overlay_entries():
    """(repo path, overlay file, is_edit) for every overlay file, sorted."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(OVERLAY):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, OVERLAY).replace(os.sep, "/")
            if rel.endswith(DIFF_SUFFIX):
                entries.append((rel[: -len(DIFF_SUFFIX)], full, True))
            else:
                entries.append((rel, full, False))
    entries.sort(key=lambda e: e[0])
    paths = [e[0] for e in entries]
    dups = {p for p in paths if paths.count(p) > 1}
    if dups:
        fail(f"both a new file and an edit exist for: {', '.join(sorted(dups))}")
    return entries


def new_file_section(path, data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"fork-overlay/{path} is not UTF-8 text")
    if not text.endswith("\n"):
        fail(f"fork-overlay/{path} must end with a newline")
    lines = text.splitlines(keepends=True)
    out = [
        f"diff --git a/{path} b/{path}\n",
        "new file mode 100644\n",
        f"index 0000000..{blob_sha(data)[:7]}\n",
        "--- /dev/null\n",
        f"+++ b/{path}\n",
        f"@@ -0,0 +1,{len(lines)} @@\n" if len(lines) != 1 else "@@ -0,0 +1 @@\n",
    ]
    out += ["+" + line for line in lines]
    return "".join(out)


def edit_section(path, full):
    with open(full, encoding="utf-8") as f:
        text = f.read()
    header = f"diff --git a/{path} b/{path}\n"
    if not text.startswith(header):
        fail(f"{os.path.relpath(full, ROOT)} must start with '{header.strip()}'")
    if not text.endswith("\n"):
        fail(f"{os.path.relpath(full, ROOT)} must end with a newline")
    return text


def sections():
    """Ordered {path: section text} of the cumulative patch."""
    out = {}
    for path, full, is_edit in overlay_entries():
        if is_edit:
            out[path] = edit_section(path, full)
        else:
            with open(full, "rb") as f:
                out[path] = new_file_section(path, f.read())
    return out


def split_patch(text):
    out, cur, buf = {}, None, []
    for line in text.splitlines(keepends=True):
        if line.startswith("diff --git a/"):
            if cur is not None:
                out[cur] = "".join(buf)
            cur = line.split(" b/", 1)[1].strip()
            buf = []
        buf.append(line)
    if cur is not None:
        out[cur] = "".join(buf)
    return out


def cmd_generate(args):
    text = "".join(sections().values())
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def cmd_check(_args):
    want = sections()
    if not os.path.exists(PATCH):
        fail(f"{os.path.relpath(PATCH, ROOT)} is missing; run "
             "scripts/regenerate_cumulative_patch.sh")
    with open(PATCH, encoding="utf-8") as f:
        have = split_patch(f.read())
    stale = sorted(p for p in set(want) | set(have) if want.get(p) != have.get(p))
    if list(want) != list(have) and not stale:
        stale = ["(file order)"]
    if stale:
        sys.stderr.write(
            "The committed cumulative patch does not match fork-overlay/ for:\n")
        for p in stale:
            what = "missing from patch" if p not in have else (
                "not in overlay" if p not in want else "differs")
            sys.stderr.write(f"  {p}: {what}\n")
        sys.stderr.write("Run scripts/regenerate_cumulative_patch.sh and commit.\n")
        sys.exit(1)
    print(f"cumulative patch is up to date ({len(want)} files)")


def read_upstream_shas():
    shas = {}
    with open(UPSTREAM_SHAS, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or line.startswith("path\t") or not line.strip():
                continue
            path, sha = line.rstrip("\n").split("\t")[:2]
            shas[path] = sha
    return shas


def edited_paths():
    return [p for p, _, is_edit in overlay_entries() if is_edit]


def check_blobs(tree):
    """Every upstream file the patch edits must have its v2.9.1 blob."""
    shas = read_upstream_shas()
    missing = [p for p in edited_paths() if p not in shas]
    if missing:
        fail("patches/upstream-blobs.tsv lacks the v2.9.1 SHA of: " + ", ".join(missing))
    bad = []
    for path in edited_paths():
        f = os.path.join(tree, path)
        if not os.path.isfile(f):
            bad.append(f"  {path}: missing")
            continue
        with open(f, "rb") as fh:
            got = blob_sha(fh.read())
        if got != shas[path]:
            bad.append(f"  {path}: blob {got[:12]}, v2.9.1 has {shas[path][:12]}")
    if bad:
        fail("these files in " + tree + " are not PyTorch v2.9.1's:\n" + "\n".join(bad)
             + "\nCheck out v2.9.1 (d38164a545b4a4e4e0cf73ce67173f70574890b6) first.")
    print(f"OK: {len(edited_paths())} upstream files match v2.9.1")


def git_apply(tree, patch, check_only):
    cmd = ["git", "apply", "--whitespace=nowarn"] + (["--check"] if check_only else [])
    cmd.append(os.path.abspath(patch))
    res = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if res.returncode != 0:
        fail(f"git apply {'--check ' if check_only else ''}failed in {tree}:\n{res.stderr}")


def resolve_tree(args):
    if getattr(args, "apply", False) and not args.pytorch:
        fail("--apply needs --pytorch DIR: the default tree is the v2.9.1 baseline cache "
             f"({DEFAULT_BASELINE}), which the checks need unpatched")
    tree = args.pytorch or DEFAULT_BASELINE
    if not os.path.isdir(tree):
        fail(f"no PyTorch tree at {tree}: pass --pytorch DIR (a v2.9.1 checkout) "
             "or rebuild the baseline cache (see README)")
    if tree == DEFAULT_BASELINE:
        complete_baseline(tree)
    return tree


def complete_baseline(tree):
    """Copies into the baseline cache the edited files the kit does not
    rebuild, from INDEX_READS, where their blob is v2.9.1's."""
    shas = read_upstream_shas()
    for path in edited_paths():
        src, dst = os.path.join(INDEX_READS, path), os.path.join(tree, path)
        if os.path.exists(dst):
            continue
        if not os.path.isfile(src):
            fail(f"{tree} lacks {path}, which the baseline kit does not rebuild: save the index read "
                 "tests/compile/callers.tsv names for it and run scripts/index_reads.py")
        with open(src, "rb") as f:
            data = f.read()
        if blob_sha(data) != shas.get(path):
            fail(f"{src} is not v2.9.1's blob {shas.get(path)} (patches/upstream-blobs.tsv)")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)


def cmd_verify(args):
    tree = resolve_tree(args)
    check_blobs(tree)
    git_apply(tree, PATCH, check_only=True)
    print(f"OK: git apply --check {os.path.relpath(PATCH, ROOT)} in {tree}")
    if args.apply:
        git_apply(tree, PATCH, check_only=False)
        print(f"applied to {tree}")


def run_git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def copy_edited(tree, out):
    """Copies the upstream files the patch edits from tree into out."""
    os.makedirs(out, exist_ok=True)
    for path in edited_paths():
        dst = os.path.join(out, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(tree, path), dst)


def cmd_materialize(args):
    tree = resolve_tree(args)
    check_blobs(tree)
    out = args.out
    if os.path.exists(out) and os.listdir(out):
        fail(f"--out {out} exists and is not empty")
    copy_edited(tree, out)
    run_git(out, "init", "-q")
    run_git(out, "add", "-A")
    # Empty when the overlay only adds files (a prefix of the patch series).
    run_git(out, "-c", "user.name=baseline", "-c", "user.email=baseline@localhost",
            "commit", "--allow-empty", "-qm", "v2.9.1 baseline (scratch; never push)")
    with tempfile.NamedTemporaryFile("w", suffix=".patch", delete=False) as f:
        f.write("".join(sections().values()))
    git_apply(out, f.name, check_only=False)
    os.unlink(f.name)
    print(f"scratch tree ready at {out}: edit files there (new files too), then\n"
          f"  scripts/overlay.py capture --scratch {out}")


def cmd_capture(args):
    scratch = args.scratch
    if not os.path.isdir(os.path.join(scratch, ".git")):
        fail(f"{scratch} is not a scratch tree made by 'materialize'")
    run_git(scratch, "add", "-A", "-N")
    res = subprocess.run(
        ["git", "diff", "--no-color", "--no-ext-diff", "--src-prefix=a/",
         "--dst-prefix=b/", "HEAD"], cwd=scratch, capture_output=True, text=True,
        check=True)
    diff = split_patch(res.stdout)
    # Start from a clean overlay so deleted edits and files disappear too.
    shutil.rmtree(OVERLAY)
    for path, section in diff.items():
        if "\nnew file mode " in section.split("@@", 1)[0]:
            dst = os.path.join(OVERLAY, path)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(scratch, path), dst)
        else:
            dst = os.path.join(OVERLAY, path + DIFF_SUFFIX)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "w", encoding="utf-8") as f:
                f.write(section)
    print(f"captured {len(diff)} files into fork-overlay/; now run "
          "scripts/regenerate_cumulative_patch.sh")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out")
    sub.add_parser("check")
    for name in ("verify", "materialize"):
        s = sub.add_parser(name)
        s.add_argument("--pytorch", help="a PyTorch v2.9.1 checkout "
                       f"(default: the baseline cache {DEFAULT_BASELINE})")
        if name == "verify":
            s.add_argument("--apply", action="store_true")
        else:
            s.add_argument("--out", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--scratch", required=True)
    args = p.parse_args()
    {"generate": cmd_generate, "check": cmd_check, "verify": cmd_verify,
     "materialize": cmd_materialize, "capture": cmd_capture}[args.cmd](args)


if __name__ == "__main__":
    main()
