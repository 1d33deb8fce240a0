#!/usr/bin/env python3
"""Copies one file-static function of an Objective-C++ file, with the file's
includes, into a file of its own, where it has external linkage.

  extract_function.py IN OUT NAMESPACE NAME

The glue build cannot compile some op files whole (their object subscripting
needs a runtime that GCC's is not), but it can compile a function of ours in
them. The function's text is copied from its `static ... NAME(` line to the
first line that is `}`, without the word `static`, inside `namespace
NAMESPACE`; before it come the lines of IN up to its first `namespace`. Its
object subscript assignments are spelled out as Apple's compiler does
(lower_subscripts.py). It fails unless it finds exactly one such function.
"""

import re
import sys

from lower_subscripts import lower


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    src, dst, namespace, name = sys.argv[1:]
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")
    preamble = lines[: next(i for i, line in enumerate(lines) if line.startswith("namespace "))]
    starts = [i for i, line in enumerate(lines) if re.match(rf"^static .*\b{re.escape(name)}\(", line)]
    if len(starts) != 1:
        sys.exit(f"{src}: {len(starts)} definitions of static {name}(), expected 1")
    start = starts[0]
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    body = [lines[start][len("static "):]] + lines[start + 1:end + 1]
    body, _ = lower(body)
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(preamble + [f"namespace {namespace} {{"] + body + [f"}} // namespace {namespace}", ""]))


if __name__ == "__main__":
    main()
