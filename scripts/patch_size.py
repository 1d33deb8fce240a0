#!/usr/bin/env python3
"""Per-file line counts of the cumulative patch, against the patch at another git revision.

    scripts/patch_size.py [--base REV]      (default REV: main)

Prints a Markdown table (as in reports/patch-size.md): for each file the patch touches,
added / removed lines and all lines of its part of the patch (headers and context included),
at REV and in the working tree.
"""

import argparse
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
PATCH = "patches/cumulative-v2.9.1-to-mps-stream-pool.patch"


def counts(text):
    files, current = {}, None
    for line in text.splitlines():
        if line.startswith("diff --git "):
            current = files.setdefault(line.split(" b/")[-1], [0, 0, 0])
            continue
        if current is None:
            continue
        current[2] += 1
        if line.startswith("+") and not line.startswith("+++"):
            current[0] += 1
        elif line.startswith("-") and not line.startswith("---"):
            current[1] += 1
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main")
    args = parser.parse_args()
    before_text = subprocess.check_output(["git", "-C", ROOT, "show", f"{args.base}:{PATCH}"], text=True)
    with open(os.path.join(ROOT, PATCH)) as f:
        after_text = f.read()
    before, after = counts(before_text), counts(after_text)
    print(f"| file | {args.base} +/− | {args.base} lines | now +/− | now lines | change |")
    print("|---|---:|---:|---:|---:|---:|")
    zero = [0, 0, 0]
    for name in sorted(set(before) | set(after), key=lambda n: (-before.get(n, zero)[2], n)):
        b, a = before.get(name, zero), after.get(name, zero)
        print(f"| `{name}` | {b[0]} / {b[1]} | {b[2]} | {a[0]} / {a[1]} | {a[2]} | {a[2] - b[2]:+d} |")
    total_b = [sum(v[i] for v in before.values()) for i in range(3)]
    total_a = [sum(v[i] for v in after.values()) for i in range(3)]
    print(f"| all {len(after)} files | {total_b[0]} / {total_b[1]} | {total_b[2]} | "
          f"{total_a[0]} / {total_a[1]} | {total_a[2]} | {total_a[2] - total_b[2]:+d} |")
    nb, na = len(before_text.splitlines()), len(after_text.splitlines())
    print(f"| the patch file (`wc -l`) | | {nb} | | {na} | {na - nb:+d} |")


if __name__ == "__main__":
    main()
