#!/usr/bin/env python3
"""The single-thread figures of issue 12, side by side, in one run.

Runs the benchmark programs of one build in rounds and prints, for each
figure, its value in every round, the median of the rounds and whether that
median meets the goal. Every figure is a ratio (or, for the hook, a time)
of two benchmarks of one program run, repetitions randomly interleaved, so
machine drift moves both sides alike.

    scripts/single_thread_set.py [--bench DIR] [--rounds N] [--cpu K]

DIR holds bench_allocator, bench_hot_paths, bench_hot_paths_shared and
bench_inference (default build/dev/tests/bench). Single-thread benchmarks of
the allocator, the lookup and the hook run pinned to CPU K (taskset), so a
migration between cores is not timed, and all their rounds run first; the
8- and 16-thread figures and inference (whose simulated GPU runs on threads
of its own) follow, not pinned.
The 8-thread allocator figure is judged only on a machine with at least 8
CPUs. Exits 1 when a judged median misses its goal.
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--benchmark_enable_random_interleaving=true", "--benchmark_format=json",
         "--benchmark_report_aggregates_only=true"]
ALLOC = "BM_MallocFree<{}>/real_time/threads:{}"
INFER = "BM_Inference_{}/real_time/threads:{}"

# One program run: the same run serves every figure that names it.
Run = collections.namedtuple("Run", ["program", "pinned", "flags"])
# A figure: `value` maps the run's medians to the number compared with `goal`
# (`higher`: at least the goal, else at most), judged on >= `cpus` CPUs.
Figure = collections.namedtuple("Figure", ["name", "goal", "higher", "run", "value", "cpus"], defaults=[1])

ALLOC_1 = Run("bench_allocator", True, ("--benchmark_filter=threads:1$", "--benchmark_min_time=0.3",
                                        "--benchmark_repetitions=15"))
ALLOC_8 = Run("bench_allocator", False, ("--benchmark_filter=threads:8$", "--benchmark_min_time=0.3",
                                         "--benchmark_repetitions=15"))
INFER_RUN = Run("bench_inference", False, ("--benchmark_filter=threads:(1|16)$", "--benchmark_min_time=1",
                                           "--benchmark_repetitions=9"))
FIGURES = [
    Figure("malloc + free, 4 pairs, 1 thread, patch / v2.9.1 model", 1.10, False, ALLOC_1,
           lambda t: t[ALLOC.format("PerPool", 1)] / t[ALLOC.format("V291Model", 1)]),
    Figure("malloc + free, 8 threads, v2.9.1 model / patch time", 50.0, True, ALLOC_8,
           lambda t: t[ALLOC.format("V291Model", 8)] / t[ALLOC.format("PerPool", 8)], cpus=8),
]
for program, where in (("bench_hot_paths", "linked in"), ("bench_hot_paths_shared", "shared library")):
    hot = Run(program, True, ("--benchmark_filter=threads:1$|BufferAccess", "--benchmark_min_time=0.2",
                              "--benchmark_repetitions=9"))
    FIGURES += [
        Figure(f"lookup, {where}, patch / v2.9.1 singleton", 1.25, False, hot,
               lambda t: t["BM_CurrentStream_Pool/threads:1"] / t["BM_CurrentStream_V291Singleton/threads:1"]),
        Figure(f"buffer access with the hook, {where}, ns", 5.0, False, hot,
               lambda t: t["BM_BufferAccess_SameStreamHook"]),
    ]
FIGURES += [
    Figure("inference, 1 thread, patch / one stream", 1.02, False, INFER_RUN,
           lambda t: t[INFER.format("Pool", 1)] / t[INFER.format("V291OneStream", 1)]),
    Figure("inference, 16 threads, one stream / patch time", 4.0, True, INFER_RUN,
           lambda t: t[INFER.format("V291OneStream", 16)] / t[INFER.format("Pool", 16)]),
]


def medians(bench, run, cpu):
    """Median time (ns) of every benchmark of one program run, by name."""
    cmd = [os.path.join(bench, run.program), *run.flags, *FLAGS]
    if run.pinned:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
    return {b["run_name"]: b["real_time"] * scale[b["time_unit"]]
            for b in json.loads(out)["benchmarks"] if b.get("aggregate_name") == "median"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default=os.path.join(ROOT, "build/dev/tests/bench"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=1)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    programs = {f.run.program for f in FIGURES}
    missing = sorted(p for p in programs if not os.access(os.path.join(args.bench, p), os.X_OK))
    if missing:
        parser.error(f"--bench {args.bench} lacks {', '.join(missing)} (cmake --build --preset dev builds them)")
    if args.cpu < 0 or args.cpu >= os.cpu_count():
        parser.error(f"--cpu must name one of this machine's {os.cpu_count()} CPUs, got {args.cpu}")

    # Every round of the pinned programs runs before any multi-thread one:
    # all-core load can leave a machine slower for a while (clock or CPU
    # quota), which would time the single-thread paths in that state.
    results = {f.run: [] for f in FIGURES}  # run -> its medians in each round
    times = {}  # benchmark -> its median in each round
    for pinned in (True, False):
        for _ in range(args.rounds):
            for run in (r for r in results if r.pinned == pinned):
                results[run].append(medians(args.bench, run, args.cpu))
                for bench, t in results[run][-1].items():
                    times.setdefault(f"{run.program}: {bench}", []).append(t)

    print(f"{args.rounds} rounds; single-thread allocator, lookup and hook pinned to CPU {args.cpu}\n")
    print("| figure (goal) | rounds | median | met |\n|---|---:|---:|---|")
    missed = 0
    for f in FIGURES:
        values = [f.value(medians_of_round) for medians_of_round in results[f.run]]
        median = statistics.median(values)
        met = median >= f.goal if f.higher else median <= f.goal
        judged = os.cpu_count() >= f.cpus
        missed += judged and not met
        verdict = ("yes" if met else "NO") if judged else f"not judged on {os.cpu_count()} CPUs"
        rounds = " / ".join(f"{v:.3g}" for v in values)
        print(f"| {f.name} ({'≥' if f.higher else '≤'} {f.goal:g}) | {rounds} | {median:.3g} | {verdict} |")
    print("\n| benchmark | median ns per round |\n|---|---:|")
    for bench, ts in times.items():
        print(f"| {bench} | {' / '.join(f'{t:.4g}' for t in ts)} |")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
