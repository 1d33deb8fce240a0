#!/usr/bin/env python3
r"""Throughput of MPS inference from many threads, and dynamic batching vs. threading.

Two experiments, each written to ``<out>/bench_mps_parallel.json`` (and, if
matplotlib is installed, plotted to ``<out>/bench_mps_parallel.png``):

* thread scaling: 1..16 threads share one model (``--models``) and each runs
  ``--iters`` forwards of a small batch; one op is a forward plus a wait for
  its result (``--sync``). Reported: ops/s over all threads, speedup and
  efficiency vs. 1 thread, p50/p99 latency.
* batching vs. threading: ``--batching-threads`` callers each issue
  ``--requests`` single-sample requests for ``nn.Linear(256, 128)``, either
  running the model themselves (threading) or through
  ``torch.mps.BatchQueue`` (batching). Requests start as CPU tensors in both
  modes. Reported: samples/s and the mean batch size.

The defaults match the configuration of the earlier dML measurements
(nn.Linear 256->128 and TransformerEncoderLayer d_model=256, nhead=4, on a
batch of 4; sequence length 32). ``--device cpu`` runs the same code without
a GPU, which is useful only to check the script.
"""

import argparse
import copy
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH_QUEUE_PY = os.path.join(HERE, os.pardir, os.pardir, "fork-overlay", "torch", "mps", "batch_queue.py")
JSON_NAME = "bench_mps_parallel.json"
PNG_NAME = "bench_mps_parallel.png"
TIMEOUT = 600  # seconds for one configuration


def make_model(name, args):
    if name == "linear":
        return nn.Linear(args.in_features, args.out_features)
    if name == "mlp":
        return nn.Sequential(nn.Linear(args.in_features, 2 * args.in_features), nn.ReLU(),
                             nn.Linear(2 * args.in_features, args.in_features), nn.ReLU(),
                             nn.Linear(args.in_features, args.out_features))
    if name == "transformer":
        return nn.TransformerEncoderLayer(args.d_model, args.nhead, batch_first=True)
    raise ValueError(f"unknown model {name!r}; choose from linear, mlp, transformer")


def make_input(name, args):
    if name == "transformer":
        return torch.randn(args.batch, args.seq_len, args.d_model)
    return torch.randn(args.batch, args.in_features)


def describe(name, args):
    if name == "transformer":
        return (f"TransformerEncoderLayer(d_model={args.d_model}, nhead={args.nhead}), "
                f"input ({args.batch}, {args.seq_len}, {args.d_model})")
    if name == "mlp":
        sizes = [args.in_features, 2 * args.in_features, args.in_features, args.out_features]
        return f"MLP {'->'.join(map(str, sizes))}, batch {args.batch}"
    return f"nn.Linear({args.in_features}, {args.out_features}), batch {args.batch}"


def make_sync(device, mode):
    r"""Returns a function that waits for the calling thread's queued work."""
    if device == "mps":
        if mode == "stream" and hasattr(torch.mps, "current_stream"):
            return lambda: torch.mps.current_stream().synchronize()
        return torch.mps.synchronize  # device-wide; the only choice without the stream pool
    if device == "cuda":
        return (lambda: torch.cuda.current_stream().synchronize()) if mode == "stream" else torch.cuda.synchronize
    return lambda: None


def load_batch_queue():
    r"""``torch.mps.BatchQueue`` if this PyTorch has it, else the copy in this repository."""
    mps = getattr(torch, "mps", None)
    if mps is not None and hasattr(mps, "BatchQueue"):
        return mps.BatchQueue, "torch.mps"
    spec = importlib.util.spec_from_file_location("bench_batch_queue", BATCH_QUEUE_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BatchQueue, os.path.relpath(os.path.abspath(BATCH_QUEUE_PY))


def run_threads(num_threads, body):
    r"""Runs ``body(t, latencies, barrier)`` on ``num_threads`` threads.

    Each body does its untimed set-up, waits on ``barrier`` and then appends
    one latency (ms) per timed op to ``latencies``. Returns (seconds,
    latencies, errors); the clock runs from the moment every thread passed the
    barrier until the last one is done.
    """
    barrier = threading.Barrier(num_threads + 1, timeout=TIMEOUT)
    latencies, errors = [], []
    lock = threading.Lock()

    def run(t):
        mine = []
        try:
            body(t, mine, barrier)
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(num_threads)]
    for th in threads:
        th.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    start = time.perf_counter()
    for th in threads:
        th.join(TIMEOUT)
    seconds = time.perf_counter() - start
    if any(th.is_alive() for th in threads):
        errors.append(f"threads still running after {TIMEOUT} s")
    return seconds, latencies, errors


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100.0 * len(ordered)))]


def scaling(name, args, sync):
    r"""ops/s of ``name`` from each thread count in ``args.threads``."""
    torch.manual_seed(0)
    model = make_model(name, args).eval().to(args.device)
    rows = []
    for num_threads in args.threads:
        inputs = [make_input(name, args).to(args.device) for _ in range(num_threads)]
        models = [copy.deepcopy(model) for _ in range(num_threads)] if args.model_per_thread else None

        def body(t, latencies, barrier):
            m = models[t] if models else model
            x = inputs[t]
            with torch.no_grad():
                for _ in range(args.warmup):
                    m(x)
                sync()
                barrier.wait()
                for _ in range(args.iters):
                    start = time.perf_counter()
                    m(x)
                    sync()
                    latencies.append((time.perf_counter() - start) * 1000.0)

        seconds, latencies, errors = run_threads(num_threads, body)
        ops = len(latencies)
        rows.append({
            "threads": num_threads,
            "ops": ops,
            "expected_ops": num_threads * args.iters,
            "seconds": seconds,
            "ops_per_s": ops / seconds if seconds > 0 else 0.0,
            "mean_ms": statistics.mean(latencies) if latencies else None,
            "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99),
            "errors": errors[:5],
        })
    base = rows[0]["ops_per_s"] if rows and rows[0]["threads"] == 1 else None
    for row in rows:
        row["speedup"] = row["ops_per_s"] / base if base else None
        row["efficiency"] = row["speedup"] / row["threads"] if base else None
    return rows


def batching_vs_threading(args, sync):
    r"""samples/s for single-sample requests: each caller runs the model, or a BatchQueue batches them."""
    BatchQueue, source = load_batch_queue()
    torch.manual_seed(0)
    model = make_model("linear", args).eval().to(args.device)

    def synced(batch):
        out = model(batch)
        sync()  # futures resolve once the batch's results exist
        return out

    rows = []
    for callers in args.batching_threads:
        samples = [[torch.randn(args.in_features) for _ in range(args.requests)] for _ in range(callers)]

        def threaded(t, latencies, barrier):
            with torch.no_grad():
                barrier.wait()
                for x in samples[t]:
                    start = time.perf_counter()
                    model(x.to(args.device).unsqueeze(0))
                    sync()
                    latencies.append((time.perf_counter() - start) * 1000.0)

        row = {"callers": callers, "requests_per_caller": args.requests}
        seconds, latencies, errors = run_threads(callers, threaded)
        row["threading"] = {"samples_per_s": len(latencies) / seconds, "p50_ms": percentile(latencies, 50),
                            "p99_ms": percentile(latencies, 99), "errors": errors[:5]}

        # Each caller has one request in flight, so a batch is full once every caller submitted.
        max_batch = min(args.max_batch, callers)
        with BatchQueue(synced, max_batch=max_batch, max_wait_ms=args.max_wait_ms, device=args.device,
                        name="bench") as q:
            def batched(t, latencies, barrier):
                barrier.wait()
                for x in samples[t]:
                    start = time.perf_counter()
                    q(x)
                    latencies.append((time.perf_counter() - start) * 1000.0)

            seconds, latencies, errors = run_threads(callers, batched)
            stats = q.stats()
        row["batching"] = {"samples_per_s": len(latencies) / seconds, "p50_ms": percentile(latencies, 50),
                           "p99_ms": percentile(latencies, 99), "max_batch": max_batch,
                           "mean_batch_size": stats["mean_batch_size"], "errors": errors[:5]}
        row["batching_speedup"] = row["batching"]["samples_per_s"] / max(row["threading"]["samples_per_s"], 1e-9)
        rows.append(row)
    return {"model": f"nn.Linear({args.in_features}, {args.out_features}), one sample per request",
            "batch_queue": source,
            "max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms, "rows": rows}


def system_info(args):
    info = {
        "label": args.label,
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "device": args.device,
        "stream_pool": hasattr(getattr(torch, "mps", None), "release_current_thread_slot"),
        "env": {k: os.environ[k] for k in ("MPS_STREAM_POOL_WAIT_TIMEOUT_MS", "MPS_FORCE_GRAPH_PATH",
                                           "MPS_ENABLE_COMMIT_AND_CONTINUE") if k in os.environ},
    }
    if sys.platform == "darwin":
        for key, cmd in (("chip", ["sysctl", "-n", "machdep.cpu.brand_string"]),
                         ("memory_bytes", ["sysctl", "-n", "hw.memsize"]),
                         ("macos", ["sw_vers", "-productVersion"])):
            try:
                info[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                info[key] = None
    return info


def print_tables(result):
    for name, section in result["scaling"].items():
        print(f"\n### {section['model']}  (sync: {result['config']['sync']})\n")
        print("| threads | ops/s | speedup | efficiency | p50 ms | p99 ms | ops | errors |")
        print("|---|---|---|---|---|---|---|---|")
        for r in section["rows"]:
            speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
            eff = f"{100 * r['efficiency']:.0f}%" if r["efficiency"] else "-"
            p50 = f"{r['p50_ms']:.2f}" if r["p50_ms"] is not None else "-"
            p99 = f"{r['p99_ms']:.2f}" if r["p99_ms"] is not None else "-"
            print(f"| {r['threads']} | {r['ops_per_s']:.0f} | {speedup} | {eff} | {p50} | {p99} | "
                  f"{r['ops']}/{r['expected_ops']} | {len(r['errors'])} |")
    b = result.get("batching")
    if b:
        print(f"\n### Batching vs threading: {b['model']}, max_batch=min({b['max_batch']}, callers), "
              f"max_wait_ms={b['max_wait_ms']}\n")
        print("| callers | threading samples/s | batching samples/s | speedup | mean batch | errors |")
        print("|---|---|---|---|---|---|")
        for r in b["rows"]:
            errors = len(r["threading"]["errors"]) + len(r["batching"]["errors"])
            print(f"| {r['callers']} | {r['threading']['samples_per_s']:.0f} | {r['batching']['samples_per_s']:.0f} | "
                  f"{r['batching_speedup']:.2f}x | {r['batching']['mean_batch_size']:.1f} | {errors} |")


def plot(result, path):
    r"""Writes the PNG; returns False (and says why) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    batching = result.get("batching")
    fig, axes = plt.subplots(1, 2 if batching else 1, figsize=(12 if batching else 6, 4.5), squeeze=False)
    ax = axes[0][0]
    for name, section in result["scaling"].items():
        rows = section["rows"]
        ax.plot([r["threads"] for r in rows], [r["ops_per_s"] for r in rows], marker="o", label=name)
    threads = sorted({r["threads"] for s in result["scaling"].values() for r in s["rows"]})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(threads)
    ax.set_xticklabels([str(t) for t in threads])
    ax.set_xlabel("threads")
    ax.set_ylabel("ops/s, all threads (log scale)")
    ax.set_title(f"Thread scaling ({result['system']['device']}, sync={result['config']['sync']})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if batching:
        ax = axes[0][1]
        rows = batching["rows"]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["threading"]["samples_per_s"] for r in rows], width=0.4, label="threading")
        ax.bar([x + 0.2 for x in xs], [r["batching"]["samples_per_s"] for r in rows], width=0.4, label="BatchQueue")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([str(r["callers"]) for r in rows])
        ax.set_xlabel("concurrent callers")
        ax.set_ylabel("samples/s")
        ax.set_title("Single-sample requests: batching vs threading")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
    label = result["system"].get("label")
    fig.suptitle(f"torch {result['system']['torch']}" + (f" ({label})" if label else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="mps", help="mps (default), cuda or cpu")
    p.add_argument("--out", default=".", help="directory for the JSON and PNG files (default: .)")
    p.add_argument("--label", default="", help="free text stored with the results, e.g. 'patched' or 'stock'")
    p.add_argument("--models", default="linear,transformer",
                   help="comma-separated: linear, mlp, transformer (default: linear,transformer)")
    p.add_argument("--threads", type=int_list, default=[1, 2, 4, 8, 12, 16], help="default: 1,2,4,8,12,16")
    p.add_argument("--iters", type=int, default=100, help="timed ops per thread (default: 100)")
    p.add_argument("--warmup", type=int, default=10, help="untimed ops per thread (default: 10)")
    p.add_argument("--sync", choices=["stream", "device"], default="stream",
                   help="after each op wait for the thread's stream (default) or for the whole device")
    p.add_argument("--model-per-thread", action="store_true", help="each thread gets its own copy of the model")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--in-features", type=int, default=256)
    p.add_argument("--out-features", type=int, default=128)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--nhead", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batching-threads", type=int_list, default=[8, 16, 32],
                   help="concurrent callers for batching vs threading (default: 8,16,32)")
    p.add_argument("--requests", type=int, default=200, help="requests per caller (default: 200)")
    p.add_argument("--max-batch", type=int, default=32, help="BatchQueue max_batch, capped at the number of callers")
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--no-batching", action="store_true", help="skip batching vs threading")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    for name in args.models:
        make_model(name, args)  # rejects unknown names before anything runs
    if args.iters < 1 or args.warmup < 0 or args.requests < 1:
        p.error("--iters and --requests must be >= 1 and --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.device == "mps" and not torch.backends.mps.is_available():
        sys.exit("MPS is not available in this PyTorch / on this machine (use --device cpu to test the script)")
    os.makedirs(args.out, exist_ok=True)
    sync = make_sync(args.device, args.sync)
    result = {"system": system_info(args),
              "config": {k: v for k, v in vars(args).items() if k not in ("out", "label")},
              "scaling": {}}
    print(json.dumps(result["system"], indent=1))
    for name in args.models:
        print(f"running {name} ...", flush=True)
        result["scaling"][name] = {"model": describe(name, args), "rows": scaling(name, args, sync)}
    if not args.no_batching:
        print("running batching vs threading ...", flush=True)
        result["batching"] = batching_vs_threading(args, sync)
    print_tables(result)
    json_path = os.path.join(args.out, JSON_NAME)
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {json_path}")
    if not args.no_plot:
        png_path = os.path.join(args.out, PNG_NAME)
        if plot(result, png_path):
            print(f"wrote {png_path}")
    failed = [name for name, s in result["scaling"].items()
              if any(r["errors"] or r["ops"] != r["expected_ops"] for r in s["rows"])]
    if any(r["threading"]["errors"] or r["batching"]["errors"] for r in result.get("batching", {}).get("rows", [])):
        failed.append("batching vs threading")
    if failed:
        print(f"errors or missing ops in: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
