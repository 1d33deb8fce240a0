#!/usr/bin/env python3
"""Instructions per call of a benchmarked function, counted by callgrind.

Machine noise moves times; it does not move instruction counts. Each
argument names a Google Benchmark and a function it calls once per
iteration (kept out of line in tests/bench for this purpose). The program
runs once under valgrind's callgrind, collecting inside the benchmark only,
and the function's inclusive instruction count is divided by its calls, so
the benchmark loop and its calibration runs do not count.

    scripts/bench_instructions.py [--build DIR] PROGRAM:BENCHMARK:FUNCTION ...
    (PROGRAM:BENCHMARK@FUNCTION where FUNCTION has a colon)

PROGRAM is a program in DIR (default build/callgrind/tests/bench, from
`cmake --preset callgrind`: valgrind 3.19 needs DWARF 4 debug info).
BENCHMARK is the full name the program prints (BM_X/threads:1); FUNCTION a
substring of the called function's name. Prints one line per argument.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMED = re.compile(r"^c?fn=\((\d+)\)(?: (.*))?$")


def callee_costs(path, function):
    """(calls, inclusive instructions) of the callees whose name has `function`."""
    names, calls, cost = {}, 0, 0
    callee, pending = None, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            m = NAMED.match(line)
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                if line.startswith("cfn="):
                    callee = names.get(m.group(1), "")
                continue
            if line.startswith("calls="):
                if callee and function in callee:
                    calls += int(line.split("=", 1)[1].split()[0])
                    pending = True
                continue
            if pending:
                cost += int(line.split()[1])
                pending = False
    return calls, cost


def per_call(program, benchmark, function):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--compress-strings=yes", f"--callgrind-out-file={out}",
             f"--toggle-collect=*{re.split('[/<]', benchmark)[0]}*", program,
             f"--benchmark_filter=^{re.escape(benchmark)}$", "--benchmark_min_time=0.2"],
            capture_output=True, text=True)
        if run.returncode != 0 or not os.path.exists(out):
            sys.exit(f"error: {benchmark} did not run under callgrind:\n{run.stderr[-2000:]}")
        calls, cost = callee_costs(out, function)
    if not calls:
        sys.exit(f"error: {benchmark} never called a function named like {function!r}")
    return cost / calls, calls


def specs(doc):
    """(program path, benchmark, function) for each argument; see the usage above."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build", "callgrind", "tests", "bench"))
    p.add_argument("specs", nargs="+", metavar="PROGRAM:BENCHMARK:FUNCTION")
    args = p.parse_args()
    for spec in args.specs:
        program, rest = spec.split(":", 1)
        benchmark, function = rest.split("@", 1) if "@" in rest else rest.rsplit(":", 1)
        yield os.path.join(args.build, program), benchmark, function


def main():
    for program, benchmark, function in specs(__doc__):
        per, calls = per_call(program, benchmark, function)
        print(f"{benchmark} {function}: {per:.1f} instructions per call ({calls} calls)")


if __name__ == "__main__":
    main()
