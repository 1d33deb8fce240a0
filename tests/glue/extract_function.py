#!/usr/bin/env python3
"""Copies definitions of an Objective-C++ file, with the file's includes, into
a file of their own, where the functions have external linkage.

  extract_function.py IN OUT NAMESPACE::NAME...

The glue build cannot compile some op files whole (their object subscripting
needs a runtime that GCC's is not), but it can compile parts of them that
use none. For each NAME, in the order given, the definition that starts at
the beginning of a line naming `NAME(` (a function, copied to the first line
that is `}`, without the word `static`) or `NAME = ` (a variable, one line)
is copied inside `namespace NAMESPACE`; before them come the lines of IN up
to its first `namespace`. Object subscript assignments are spelled out as
Apple's compiler does (lower_subscripts.py). It fails unless it finds
exactly one definition of each NAME.
"""

import re
import sys

from lower_subscripts import lower


def definition(lines, name):
    starts = [i for i, line in enumerate(lines)
              if re.match(rf"^[A-Za-z].*\b{re.escape(name)}(\(| = )", line) and not line.startswith("namespace")]
    if len(starts) != 1:
        sys.exit(f"{len(starts)} definitions of {name}, expected 1")
    start = starts[0]
    if lines[start].endswith(";"):
        return [lines[start]]
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    first = lines[start][len("static "):] if lines[start].startswith("static ") else lines[start]
    return [first] + lines[start + 1:end + 1]


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    src, dst, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = lines[: next(i for i, line in enumerate(lines) if line.startswith("namespace "))]
    for qualified in names:
        namespace, _, name = qualified.rpartition("::")
        body, _ = lower(definition(lines, name))
        out += [f"namespace {namespace} {{"] + body + [f"}} // namespace {namespace}"]
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(out + [""]))


if __name__ == "__main__":
    main()
