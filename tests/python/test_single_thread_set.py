"""Tests for scripts/single_thread_set.py against stand-in benchmark programs that print fixed medians:
which benchmarks each figure divides, the verdicts and exit status, and that the pinned programs run
every round before any multi-thread one."""

import json
import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "scripts",
                      "single_thread_set.py")
ALLOC = "BM_MallocFree<{}>/real_time/threads:{}"
INFER = "BM_Inference_{}/real_time/threads:{}"
HOT = {"BM_CurrentStream_V291Singleton/threads:1": 1.0, "BM_BufferAccess_SameStreamHook": 3.0}
MEDIANS = {  # ns; the time unit of the inference programs is us, as Google Benchmark prints it
    "bench_allocator": {ALLOC.format("V291Model", 1): 250.0, ALLOC.format("PerPool", 1): 200.0,
                        ALLOC.format("V291Model", 8): 10000.0, ALLOC.format("PerPool", 8): 100.0},
    "bench_hot_paths": dict(HOT, **{"BM_CurrentStream_Pool/threads:1": 1.2}),
    "bench_hot_paths_shared": dict(HOT, **{"BM_CurrentStream_Pool/threads:1": 1.5}),
    "bench_inference": {INFER.format("V291OneStream", 1): 500.0, INFER.format("Pool", 1): 505.0,
                        INFER.format("V291OneStream", 16): 300.0, INFER.format("Pool", 16): 60.0},
}
FAKE = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
with open(os.path.join(os.path.dirname(sys.argv[0]), "calls.log"), "a") as log:
    log.write(name + " " + " ".join(a for a in sys.argv[1:] if "filter" in a) + "\\n")
unit = "us" if name == "bench_inference" else "ns"
print(json.dumps({{"benchmarks": [
    {{"run_name": run, "aggregate_name": "median", "real_time": t, "time_unit": unit}}
    for run, t in {medians}[name].items()]}}))
"""


@pytest.fixture
def bench(tmp_path):
    if shutil.which("taskset") is None:
        pytest.skip("taskset is not installed")
    for program in MEDIANS:
        path = tmp_path / program
        path.write_text(FAKE.format(python=sys.executable, medians=json.dumps(MEDIANS)))
        path.chmod(0o755)
    return tmp_path


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def rows(stdout):
    """figure -> (median, verdict) from the first table."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[2] not in ("median", "---:"):
            out[cells[0].split(" (")[0]] = (float(cells[2]), cells[3])
    return out


def test_figures_divide_the_right_benchmarks_and_a_miss_fails(bench):
    res = run("--bench", str(bench), "--rounds", "2", "--cpu", "0")
    got = rows(res.stdout)
    assert got["malloc + free, 4 pairs, 1 thread, patch / v2.9.1 model"] == (0.8, "yes")
    eight = got["malloc + free, 8 threads, v2.9.1 model / patch time"]
    assert eight[0] == 100.0 and eight[1] == ("yes" if os.cpu_count() >= 8 else f"not judged on {os.cpu_count()} CPUs")
    assert got["lookup, linked in, patch / v2.9.1 singleton"] == (1.2, "yes")
    assert got["lookup, shared library, patch / v2.9.1 singleton"] == (1.5, "NO")
    assert got["buffer access with the hook, shared library, ns"] == (3.0, "yes")
    assert got["inference, 1 thread, patch / one stream"] == (1.01, "yes")
    assert got["inference, 16 threads, one stream / patch time"] == (5.0, "yes")
    assert res.returncode == 1, res.stdout + res.stderr


def test_every_pinned_round_runs_before_the_multi_thread_programs(bench):
    run("--bench", str(bench), "--rounds", "2", "--cpu", "0")
    calls = (bench / "calls.log").read_text().splitlines()
    multi = [i for i, c in enumerate(calls) if "threads:8" in c or c.startswith("bench_inference")]
    assert len(calls) == 10 and len(multi) == 4 and min(multi) == 6, calls


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--cpu", "100000"], "--cpu must name one of this machine's"),
    (["--bench", "/nonexistent"], "--bench /nonexistent lacks bench_allocator"),
])
def test_bad_arguments_are_named(bench, args, message):
    res = run(*(["--bench", str(bench)] + args))
    assert res.returncode == 2 and message in res.stderr, res.stderr
