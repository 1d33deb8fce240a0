#!/usr/bin/env python3
"""Copies an Objective-C++ file, spelling out its NSMutableArray element
assignments as the messages they stand for.

  lower_subscripts.py IN OUT COUNT

Clang accepts `array[i] = object;` only for runtimes that declare object
subscripting, which GCC's (the one the glue runs on) does not. Apple's
compiler turns that line into `[array setObject:object atIndexedSubscript:i];`,
and so does this script, for each line whose value is an `[NSNumber ...]`
message (an object, so the receiver is an Objective-C array, not a C++
vector). Nothing else changes. It fails unless it rewrote exactly COUNT lines,
so an input that changes cannot slip through half-lowered.
"""

import re
import sys

ASSIGNMENT = re.compile(r"^(\s*)([A-Za-z_]\w*)\[(.+?)\] = (\[NSNumber \w+:.*\]);$")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")
    rewritten = 0
    for n, line in enumerate(lines):
        m = ASSIGNMENT.match(line)
        if m:
            indent, array, index, value = m.groups()
            lines[n] = f"{indent}[{array} setObject:{value} atIndexedSubscript:{index}];"
            rewritten += 1
    if rewritten != expected:
        sys.exit(f"{src}: expected {expected} NSMutableArray element assignments, found {rewritten}")
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
