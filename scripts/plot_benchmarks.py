#!/usr/bin/env python3
"""Plots the thread-scaling benchmarks for reports/performance.md.

    scripts/plot_benchmarks.py RESULTS_DIR OUT_DIR

RESULTS_DIR holds the Google Benchmark JSON files written by the harness
benchmarks (bench_inference.json, bench_allocator.json). Writes
inference_scaling.png and allocator_scaling.png into OUT_DIR and prints the
tables they are drawn from.
"""

import json
import os
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)["benchmarks"]


def series(benchmarks, value):
    """{family: {threads: value}} from median (or single-run) entries."""
    out = defaultdict(dict)
    for b in benchmarks:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        m = re.match(r"(BM_[^/]+)(?:/.*?)?/threads:(\d+)", b["name"])
        if m:
            out[m.group(1)][int(m.group(2))] = value(b)
    return out


def plot(data, title, ylabel, path):
    plt.figure(figsize=(6, 4))
    for name, points in sorted(data.items()):
        xs = sorted(points)
        label = name.replace("BM_", "").replace("<", " ").replace(">", "")
        plt.plot(xs, [points[x] for x in xs], marker="o", label=label)
    plt.xscale("log", base=2)
    plt.xlabel("threads")
    plt.ylabel(ylabel)
    plt.title(title)
    plt.grid(True, alpha=0.3)
    plt.legend()
    plt.tight_layout()
    plt.savefig(path, dpi=120)
    plt.close()


def table(data, unit):
    threads = sorted({t for points in data.values() for t in points})
    names = sorted(data)
    print("threads | " + " | ".join(n.replace("BM_", "") for n in names) + f" ({unit})")
    for t in threads:
        print(f"{t} | " + " | ".join(f"{data[n].get(t, float('nan')):.4g}" for n in names))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    results, out = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    inference = series(load(os.path.join(results, "bench_inference.json")),
                       lambda b: b["items_per_second"])
    table(inference, "items/s")
    plot(inference, "Simulated inference: one stream (v2.9.1) vs stream pool",
         "inferences / s", os.path.join(out, "inference_scaling.png"))
    allocator = series(load(os.path.join(results, "bench_allocator.json")),
                       lambda b: b["items_per_second"])
    table(allocator, "malloc/free pairs/s")
    plot(allocator, "Allocator malloc/free: one recursive mutex vs per-pool core",
         "malloc/free pairs / s", os.path.join(out, "allocator_scaling.png"))


if __name__ == "__main__":
    main()
