#!/usr/bin/env python3
"""Installs the v2.9-era upstream texts that the glue tests and the compile
check take from ~/.cache, from reads of the public code index saved as
READS/<basename>.<index_id>: the verbatim text of every page joined, as for
the baseline kit (../shared/baseline/README.md, step 2).

  - tests/glue/upstream.tsv, rows built=yes:
    ~/.cache/pytorch-v2.9-mps-glue-upstream/<path>;
  - tests/compile/callers.tsv: ~/.cache/pytorch-v2.9-mps-callers/<path> as
    read, and ~/.cache/pytorch-v2.9-mps-callers-resolved/<path> with the
    conflict markers resolved to the side the row's note names (the kit's
    resolve_conflicts.py), with the identifiers a fork renamed given back
    their names, in the order the note lists them (`renamed FROM>TO,... sha
    SHA`), or as read when the note names neither.

Every text is checked against the git blob SHA-1 its row pins (a resolved
text against the sha in the note) and written only if it matches. Prints
the reads still to make (id, chars, pages of 16,000) and exits 1 when any
text is missing or does not match.
"""

import argparse
import os
import re
import subprocess
import sys

from overlay import blob_sha

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(os.path.expanduser("~"), ".cache")
KIT = os.path.join(ROOT, "..", "shared", "baseline", "resolve_conflicts.py")
RESOLVED = re.compile(r"resolved=(HEAD|theirs) sha ([0-9a-f]{40})")
RENAMED = re.compile(r"renamed (\S+) sha ([0-9a-f]{40})")


def rows(tsv):
    with open(os.path.join(ROOT, tsv), encoding="utf-8") as f:
        lines = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    return [dict(zip(lines[0], cols)) for cols in lines[1:]]


def install(data, sha, dest):
    if blob_sha(data) != sha:
        return False
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "wb") as f:
        f.write(data)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reads", required=True, help="directory of <basename>.<index_id> files")
    args = p.parse_args()
    wanted = [(r, "pytorch-v2.9-mps-glue-upstream") for r in rows("tests/glue/upstream.tsv") if r["built"] == "yes"]
    wanted += [(r, "pytorch-v2.9-mps-callers") for r in rows("tests/compile/callers.tsv")]
    failed = 0
    for r, cache in wanted:
        path, index_id = r["path"], r["index_id"]
        read = os.path.join(args.reads, f"{os.path.basename(path)}.{index_id}")
        if not os.path.isfile(read):
            pages = -(-int(r["chars"]) // 16000)
            print(f"MISSING  {path}: read index id {index_id} ({r['chars']} chars, pages: {pages})")
            failed += 1
            continue
        with open(read, "rb") as f:
            data = f.read()
        dest = os.path.join(CACHE, cache, path)
        if not install(data, r["git_blob_sha1"], dest):
            print(f"WRONG    {path}: {read} has blob {blob_sha(data)}, the row pins {r['git_blob_sha1']}")
            failed += 1
            continue
        m = RESOLVED.search(r.get("note", ""))
        renamed = RENAMED.search(r.get("note", ""))
        if cache == "pytorch-v2.9-mps-callers" and m:
            side = "ours" if m.group(1) == "HEAD" else "theirs"
            resolved = subprocess.run([sys.executable, KIT, dest, "/dev/stdout", side],
                                      check=True, capture_output=True).stdout
            if not install(resolved, m.group(2), os.path.join(CACHE, cache + "-resolved", path)):
                print(f"WRONG    {path}: resolved to {side}, blob {blob_sha(resolved)}, the note pins {m.group(2)}")
                failed += 1
                continue
        elif cache == "pytorch-v2.9-mps-callers":
            sha = r["git_blob_sha1"]
            if renamed:
                for pair in renamed.group(1).split(","):
                    old, new = pair.split(">")
                    data = data.replace(old.encode(), new.encode())
                sha = renamed.group(2)
            if not install(data, sha, os.path.join(CACHE, cache + "-resolved", path)):
                done = "renames undone, " if renamed else ""
                print(f"WRONG    {path}: {done}blob {blob_sha(data)}, the row pins {sha}")
                failed += 1
                continue
        print(f"OK       {path}")
    print(f"{len(wanted) - failed} of {len(wanted)} texts installed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
