#!/usr/bin/env python3
"""Copies an Objective-C++ file, spelling out its object subscript
assignments as the messages they stand for.

  lower_subscripts.py IN OUT COUNT

Clang accepts `array[i] = object;` and `dictionary[key] = object;` only for
runtimes that declare object subscripting, which GCC's (the one the glue runs
on) does not. Apple's compiler turns them into
`[array setObject:object atIndexedSubscript:i];` and
`[dictionary setObject:object forKeyedSubscript:key];`, and so does this
script, for two kinds of line it can tell from C++ subscripts:
- an element assignment whose value is an `[NSNumber ...]` message (an
  object, so the receiver is an Objective-C array, not a C++ vector);
- an element assignment to a dictionary the file declares as
  `NSMutableDictionary... *D = `.
Nothing else changes. It fails unless it rewrote exactly COUNT lines, so an
input that changes cannot slip through half-lowered.
"""

import re
import sys

INDEXED = re.compile(r"^(\s*)([A-Za-z_]\w*)\[(.+?)\] = (\[NSNumber \w+:.*\]);$")
DICTIONARY = re.compile(r"\bNSMutableDictionary(?:<[^;]*?>)?\* (\w+) =")


def lower(lines):
    """The lines with their subscript assignments spelled out, and how many
    were rewritten."""
    keyed = {d: re.compile(rf"^(\s*){d}\[(.+)\] = (.+);$") for d in DICTIONARY.findall("\n".join(lines))}
    out = []
    for line in lines:
        m = INDEXED.match(line)
        if m:
            indent, array, index, value = m.groups()
            line = f"{indent}[{array} setObject:{value} atIndexedSubscript:{index}];"
        for d, assignment in keyed.items():
            m = assignment.match(line)
            if m:
                indent, key, value = m.groups()
                line = f"{indent}[{d} setObject:{value} forKeyedSubscript:{key}];"
        out.append(line)
    return out, sum(a != b for a, b in zip(lines, out))


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(src, encoding="utf-8") as f:
        lines, rewritten = lower(f.read().split("\n"))
    if rewritten != expected:
        sys.exit(f"{src}: expected {expected} object subscript assignments, found {rewritten}")
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
