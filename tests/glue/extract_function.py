#!/usr/bin/env python3
"""Copies definitions of an Objective-C++ file, with the file's includes, into
a file of their own, where the functions have external linkage.

  extract_function.py IN OUT NAMESPACE::NAME[/COUNT]...

The glue build cannot compile some op files whole (their object subscripting
needs a runtime that GCC's is not), but it can compile parts of them that
use none. For each NAME, in the order given, the definitions that start at
the beginning of a line naming `NAME(` (a function, copied to the first line
that is `}`, without the word `static`, and with the `template <...>` line
before it, if any), `TORCH_IMPL_FUNC(NAME)(` (a structured kernel's impl,
the same way) or `NAME = ` (a variable, one line)
are copied inside `namespace NAMESPACE`; before them come the lines of IN up
to its first `namespace`. Object subscript assignments are spelled out as
Apple's compiler does (lower_subscripts.py). It fails unless it finds
exactly COUNT definitions of each NAME (overloads; 1 when not given).
"""

import re
import sys

from lower_subscripts import lower


def definitions(lines, name, count):
    starts = [i for i, line in enumerate(lines)
              if re.match(rf"^[A-Za-z].*\b{re.escape(name)}(\(| = |\)\()", line) and not line.startswith("namespace")]
    if len(starts) != count:
        sys.exit(f"{len(starts)} definitions of {name}, expected {count}")
    out = []
    for start in starts:
        if lines[start].endswith(";"):
            out.append(lines[start])
            continue
        end = next(i for i in range(start, len(lines)) if lines[i] == "}")
        first = lines[start][len("static "):] if lines[start].startswith("static ") else lines[start]
        template = lines[start - 1:start] if start and lines[start - 1].startswith("template <") else []
        out += template + [first] + lines[start + 1:end + 1]
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    src, dst, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = lines[: next(i for i, line in enumerate(lines) if line.startswith("namespace "))]
    for qualified in names:
        qualified, _, count = qualified.partition("/")
        namespace, _, name = qualified.rpartition("::")
        body, _ = lower(definitions(lines, name, int(count or 1)))
        out += [f"namespace {namespace} {{"] + body + [f"}} // namespace {namespace}"]
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(out + [""]))


if __name__ == "__main__":
    main()
