#!/usr/bin/env python3
"""Cuts the cumulative patch into an ordered series, one pull request each.

patches/series/series.tsv declares the members and which overlay files each
takes; patches/series/headers/NN-<slug>.md is each member's PR body. The
series is patches/series/NN-<slug>.patch, generated from fork-overlay/ like
the cumulative patch.

Subcommands:
  generate                      write the series (warns if a member exceeds
                                MAX_LINES)
  check                         exit 1 if the committed series is stale or a
                                member too large
  verify [--pytorch DIR [--apply]]
                                blob check, then apply the series in order to
                                a copy of the tree's edited files and compare
                                it byte for byte with the cumulative patch's
                                result; with --apply, apply it to the tree
  compile [-j N] [--cache DIR] [NN ...]
                                differential compile check (compile_check.py)
                                of every prefix of the series, or of the
                                prefixes ending at the members named; the
                                upstream files that later members edit are
                                compiled too, as v2.9.1 has them

Note [Cutting the series]
A file belongs to one member (a `file` glob), so a new file arrives whole and
an edit lands in one step; this holds for all but one upstream file, and it
keeps series.tsv unchanged while the overlay's contents change. Where a
member needs only part of an edit, a `hunk` row moves the hunks that match a
regex to another member: the hunks of a git diff are independent, so any
subset applies, and the member's section is that subset renumbered against
the tree the earlier members leave. Hunks, not lines, are the unit because
no intermediate version of a file is kept (it would go stale with every
overlay change); where one hunk mixes two concerns the cut follows the code
(MPSStream derives from the dependency tracker's stream type, so the tracker
precedes it rather than follows). `compile` checks that each prefix builds;
`check` (in scripts/test.sh) that the committed series is what the overlay
gives, so a stale series fails CI, and scripts/regenerate_cumulative_patch.sh
rewrites it with the cumulative patch.
"""

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overlay  # noqa: E402  (scripts/ is not a package)

SERIES = os.path.join(overlay.ROOT, "patches", "series")
PLAN = os.path.join(SERIES, "series.tsv")
HEADERS = os.path.join(SERIES, "headers")
MAX_LINES = 1500
CXX_EXTS = (".h", ".mm", ".cpp")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$", re.S)


class Member:
    def __init__(self, num, slug, subject):
        self.num, self.slug, self.subject = num, slug, subject
        self.name = f"{num}-{slug}"


def read_plan():
    """(members in order, [(member, glob)], [(member, path, regex)])."""
    members, files, hunks = [], [], []
    with open(PLAN, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.rstrip("\n").split("\t")
            if cols[0] == "member" and len(cols) == 4:
                members.append(Member(*cols[1:]))
            elif cols[0] == "file" and len(cols) == 3:
                files.append((cols[1], cols[2]))
            elif cols[0] == "hunk" and len(cols) == 4:
                hunks.append((cols[1], cols[2], re.compile(cols[3])))
            else:
                overlay.fail(f"patches/series/series.tsv:{n}: not a member, file or hunk row")
    nums = [m.num for m in members]
    unknown = {num for num, *_ in files + hunks} - set(nums)
    if nums != sorted(nums) or len(set(nums)) != len(nums) or unknown:
        overlay.fail("patches/series/series.tsv: member numbers must be unique and ascending, "
                     f"and every row's member declared (unknown: {sorted(unknown)})")
    return members, files, hunks


class Hunk:
    def __init__(self, text):
        m = HUNK.match(text.split("\n", 1)[0])
        self.old, self.new = int(m.group(1)), int(m.group(3))
        old_len, new_len = int(m.group(2) or 1), int(m.group(4) or 1)
        self.lens, self.delta, self.tail = (old_len, new_len), new_len - old_len, m.group(5)
        self.body = text.split("\n", 1)[1]

    def text(self, old, new):
        return f"@@ -{old},{self.lens[0]} +{new},{self.lens[1]} @@{self.tail}\n" + self.body


def split_hunks(section):
    """(header lines, [Hunk]) of one file's section of a git diff."""
    parts = re.split(r"^(?=@@ )", section, flags=re.M)
    return parts[0], [Hunk(p) for p in parts[1:]]


def renumber(section, owners, take, before):
    """The section with only the hunks whose owner is in `take`, numbered
    against the file with the hunks whose owner is in `before` applied."""
    header, hunks = split_hunks(section)
    # Intermediate blobs are not computed (that needs the tree); git apply
    # needs no index line for a text patch.
    header = re.sub(r"^index .*\n", "", header, flags=re.M)
    out, old_shift, new_gap = [header], 0, 0
    for h, owner in zip(hunks, owners):
        if owner in take:
            out.append(h.text(h.old + old_shift, h.new - new_gap))
        if owner in before:
            old_shift += h.delta
        elif owner not in take:
            new_gap += h.delta
    return "".join(out)


def assign():
    """(members, {path: (section, [owner per hunk] or the owner of a new file)})."""
    members, files, hunk_rules = read_plan()
    is_edit = {path: edit for path, _, edit in overlay.overlay_entries()}
    out, used = {}, set()
    for path, section in overlay.sections().items():
        owners = [num for num, glob in files if fnmatch.fnmatchcase(path, glob)]
        if len(owners) != 1:
            overlay.fail(f"{path} matches {len(owners)} file rows of patches/series/series.tsv "
                         f"({', '.join(owners) or 'none'}); it needs exactly one")
        rules = [(num, rx) for num, p, rx in hunk_rules if p == path]
        if not is_edit[path]:
            if rules:
                overlay.fail(f"hunk rows apply to edits only, and {path} is a new file")
            out[path] = (section, owners[0])
            continue
        hunk_owners = []
        for h in split_hunks(section)[1]:
            hits = [(num, rx) for num, rx in rules if rx.search(h.body)]
            used.update((path, rx.pattern) for _, rx in hits[:1])
            hunk_owners.append(hits[0][0] if hits else owners[0])
        out[path] = (section, hunk_owners)
    # A rule that no longer matches (the overlay changed) would silently give
    # its hunks back to the file's member.
    unused = [f"{p} /{rx.pattern}/" for _, p, rx in hunk_rules if (p, rx.pattern) not in used]
    if unused:
        overlay.fail("hunk rows of patches/series/series.tsv that match no hunk: " + ", ".join(unused))
    return members, out


def member_sections(members, files):
    """{member number: [its section of each file it changes]}."""
    nums = [m.num for m in members]
    per = {n: [] for n in nums}
    for section, owners in files.values():
        if isinstance(owners, str):
            per[owners].append(section)
            continue
        for i, n in enumerate(nums):
            if n in owners:
                per[n].append(renumber(section, owners, {n}, set(nums[:i])))
    return per


def prefix_sections(members, files, upto):
    """{path: section} of the members up to `upto` together, against v2.9.1."""
    taken = {m.num for m in members if m.num <= upto}
    out = {}
    for path, (section, owners) in files.items():
        if isinstance(owners, str):
            if owners in taken:
                out[path] = section
        elif taken & set(owners):
            out[path] = renumber(section, owners, taken, set())
    return out


def diffstat(sections):
    rows, adds, dels = [], 0, 0
    for s in sections:
        path = s.split(" b/", 1)[1].split("\n", 1)[0]
        lines = [line for h in split_hunks(s)[1] for line in h.body.splitlines()]
        a, d = sum(line.startswith("+") for line in lines), sum(line.startswith("-") for line in lines)
        adds, dels = adds + a, dels + d
        rows.append(f" {path} | +{a} -{d}\n")
    return "".join(rows) + f" {len(sections)} files changed, +{adds} -{dels}\n"


def render():
    """{file name: text} of the series."""
    members, files = assign()
    per = member_sections(members, files)
    out = {}
    for m in members:
        hdr = os.path.join(HEADERS, m.name + ".md")
        if not os.path.isfile(hdr):
            overlay.fail(f"patches/series/headers/{m.name}.md (the PR body of member {m.num}) is missing")
        with open(hdr, encoding="utf-8") as f:
            body = f.read().strip()
        if not per[m.num]:
            overlay.fail(f"member {m.name} has no changes")
        head = (f"Subject: [PATCH {m.num}/{members[-1].num}] {m.subject}\n\n{body}\n\n"
                f"---\n{diffstat(per[m.num])}\n")
        out[m.name + ".patch"] = head + "".join(per[m.num])
    return out


def too_long(series):
    return [f"  {name}: {text.count(chr(10))} lines" for name, text in series.items()
            if text.count("\n") > MAX_LINES]


def committed():
    return sorted(f for f in os.listdir(SERIES) if f.endswith(".patch"))


def cmd_generate(_args):
    series = render()
    for name in committed():
        if name not in series:
            os.unlink(os.path.join(SERIES, name))
    for name, text in series.items():
        with open(os.path.join(SERIES, name), "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote patches/series/{name} ({text.count(chr(10))} lines)")
    if too_long(series):
        # Written anyway, so that regeneration never blocks; `check` fails.
        sys.stderr.write(f"warning: members over {MAX_LINES} lines:\n" + "\n".join(too_long(series)) + "\n")


def cmd_check(_args):
    series = render()
    stale = sorted(set(committed()) ^ set(series))
    for name, text in series.items():
        path = os.path.join(SERIES, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                if f.read() != text:
                    stale.append(name)
    if stale:
        overlay.fail("patches/series/ does not match fork-overlay/ and series.tsv for: "
                     + ", ".join(stale) + "\nRun scripts/series.py generate and commit.")
    if too_long(series):
        overlay.fail(f"members over {MAX_LINES} lines:\n" + "\n".join(too_long(series)))
    print(f"series is up to date ({len(series)} members, "
          f"{max(t.count(chr(10)) for t in series.values())} lines at most)")


def cmd_verify(args):
    tree = overlay.resolve_tree(args)
    overlay.check_blobs(tree)
    patches = [os.path.join(SERIES, name) for name in committed()]
    with tempfile.TemporaryDirectory() as tmp:
        series_tree, cumulative_tree = os.path.join(tmp, "series"), os.path.join(tmp, "cumulative")
        overlay.copy_edited(tree, series_tree)
        overlay.copy_edited(tree, cumulative_tree)
        for patch in patches:
            overlay.git_apply(series_tree, patch, check_only=False)
        overlay.git_apply(cumulative_tree, overlay.PATCH, check_only=False)
        differ = []
        for path in overlay.sections():
            got, want = (os.path.join(t, path) for t in (series_tree, cumulative_tree))
            if not os.path.isfile(got) or open(got, "rb").read() != open(want, "rb").read():
                differ.append(path)
        if differ:
            overlay.fail("the series applied in order differs from the cumulative patch in: "
                         + ", ".join(differ))
    print(f"OK: the {len(patches)} members apply in order and yield the cumulative patch's tree")
    if args.apply:
        for patch in patches:
            overlay.git_apply(tree, patch, check_only=False)
        print(f"applied the series to {tree}")


def cmd_compile(args):
    members, files = assign()
    wanted = args.members or [m.num for m in members]
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
        results = compile_prefixes(members, files, wanted, args.jobs, args.cache)
    else:
        with tempfile.TemporaryDirectory() as cache:
            results = compile_prefixes(members, files, wanted, args.jobs, cache)
    print("\n".join(["", "per-prefix compile check:"] + results))
    if any("compile-check:" in r and " 0 failed" not in r for r in results):
        sys.exit(1)


def compile_prefixes(members, files, wanted, jobs, cache):
    """compile_check.py on each wanted prefix; one result line each. The
    baseline side of every unit is the same for all prefixes: `cache` keeps it."""
    results, previous_cxx = [], None
    for m in members:
        prefix = prefix_sections(members, files, m.num)
        cxx = {p: s for p, s in prefix.items() if p.endswith(CXX_EXTS)}
        if m.num not in wanted:
            previous_cxx = cxx
            continue
        if cxx == previous_cxx:
            # The compile check reads only C++ and Objective-C++ files.
            results.append(f"{m.name}: no C++ change; same as the prefix before it")
            continue
        previous_cxx = cxx
        with tempfile.TemporaryDirectory() as tmp:
            for path, (section, owners) in files.items():
                if path not in prefix:
                    continue
                new_file = isinstance(owners, str)
                dst = os.path.join(tmp, path + ("" if new_file else overlay.DIFF_SUFFIX))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if new_file:
                    shutil.copyfile(os.path.join(overlay.OVERLAY, path), dst)
                else:
                    with open(dst, "w", encoding="utf-8") as f:
                        f.write(prefix[path])
            # Upstream files that later members edit are still v2.9.1's here,
            # and must compile against this prefix's headers (identical to
            # v2.9.1's while the prefix edits no upstream file).
            edits = [p for p, (_s, owners) in files.items() if not isinstance(owners, str)]
            later = [p for p in edits if p not in prefix and p.endswith(CXX_EXTS)] if set(edits) & set(prefix) else []
            started = time.time()
            res = subprocess.run([sys.executable, os.path.join(overlay.ROOT, "scripts", "compile_check.py"),
                                  "--overlay", tmp, "-j", str(jobs), "--cache", cache]
                                 + [arg for p in later for arg in ("--unchanged", p)],
                                 capture_output=True, text=True)
        last = (res.stdout.strip().splitlines() or ["(no output)"])[-1]
        results.append(f"{m.name}: {last} ({time.time() - started:.0f} s)")
        print(results[-1], flush=True)
        if res.returncode != 0:
            print(res.stdout + res.stderr)
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("generate")
    sub.add_parser("check")
    v = sub.add_parser("verify")
    v.add_argument("--pytorch", help="a PyTorch v2.9.1 checkout "
                   f"(default: the baseline cache {overlay.DEFAULT_BASELINE})")
    v.add_argument("--apply", action="store_true")
    c = sub.add_parser("compile")
    c.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    c.add_argument("--cache", metavar="DIR", help="keep compile results in DIR, e.g. to resume an interrupted "
                   "run in the same sitting (default: a temporary directory)")
    c.add_argument("members", nargs="*", help="member numbers (NN) whose prefixes to check")
    args = p.parse_args()
    {"generate": cmd_generate, "check": cmd_check, "verify": cmd_verify, "compile": cmd_compile}[args.cmd](args)


if __name__ == "__main__":
    main()
