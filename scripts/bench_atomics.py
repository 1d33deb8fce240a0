#!/usr/bin/env python3
"""Atomic read-modify-write instructions per call of a benchmarked function.

An uncontended atomic RMW (a lock-prefixed instruction, or xchg with memory,
which is locked implicitly) drains the store buffer; on large server cores it
costs far more than its one instruction, so instruction counts alone do not
predict time. This runs the benchmark once under callgrind with per-
instruction counts, collecting inside the named functions only (including
what they call: pthread_mutex_lock and friends), disassembles every executed
instruction of every object with objdump, and counts the RMWs.

    scripts/bench_atomics.py [--build DIR] PROGRAM:BENCHMARK@FUNCTION ...

Same arguments and build as scripts/bench_instructions.py (x86-64 only).
Prints, per argument, RMWs per call and where they were executed.
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

from bench_instructions import specs

RMW = re.compile(r"\block\b|\bxchg\w*\s+[^,]*\(|\bxchg\w*\s+\S*,\S*\(")


def instruction_counts(path):
    """{(object, function, address): executions} from a --dump-instr=yes file."""
    counts = collections.Counter()
    ob = fn = None
    in_call = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("ob="):
                ob = line[3:]
            elif line.startswith("fn="):
                fn = line[3:]
            elif line.startswith("calls="):
                in_call = True  # the next cost line is inclusive: skip it
            elif line.startswith("0x"):
                if in_call:
                    in_call = False
                    continue
                addr, _, cost = line.split()
                counts[(ob, fn, int(addr, 16))] += int(cost)
    return counts


def rmw_addresses(obj, wanted):
    """Addresses among `wanted` whose instruction is an atomic RMW in `obj`."""
    lo, hi = min(wanted), max(wanted) + 16
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--start-address={lo:#x}", f"--stop-address={hi:#x}", obj],
        capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
        if m and int(m.group(1), 16) in wanted and RMW.search(m.group(2)):
            found[int(m.group(1), 16)] = m.group(2).strip()
    return found


def run(program, benchmark, function):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--dump-instr=yes", "--compress-strings=no", "--compress-pos=no",
             f"--callgrind-out-file={out}", f"--toggle-collect=*{function}*", program,
             f"--benchmark_filter=^{re.escape(benchmark)}$", "--benchmark_min_time=0.2"],
            capture_output=True, text=True, check=True)
        counts = instruction_counts(out)
    # Calls: executions of the function's entry point.
    entries = set()
    for line in subprocess.run(["nm", "-C", program], capture_output=True, text=True, check=True).stdout.splitlines():
        addr, kind, name = line.split(" ", 2)
        if kind in "tT" and function in name and "clone" not in name:
            entries.add(int(addr, 16))
    calls = sum(n for (ob, _, a), n in counts.items() if ob == program and a in entries)
    if not calls:
        sys.exit(f"error: {benchmark} never ran a function named like {function!r}")
    by_object = collections.defaultdict(set)
    for ob, _, addr in counts:
        by_object[ob].add(addr)
    sites = collections.Counter()
    for ob, addrs in by_object.items():
        if not os.path.exists(ob):
            continue
        for addr, insn in rmw_addresses(ob, addrs).items():
            for (o, fn, a), n in counts.items():
                if o == ob and a == addr:
                    sites[(fn, insn)] += n
    return calls, sites


def main():
    for program, benchmark, function in specs(__doc__):
        calls, sites = run(program, benchmark, function)
        total = sum(sites.values())
        print(f"{benchmark} {function}: {total / calls:.2f} atomic RMWs per call ({calls} calls)")
        for (fn, insn), n in sorted(sites.items(), key=lambda kv: -kv[1]):
            print(f"    {n / calls:5.2f}  {fn}: {insn}")


if __name__ == "__main__":
    main()
