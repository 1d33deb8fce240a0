# Owner(s): ["module: mps"]
r"""MPS work from many threads at once (the MPS stream pool) against CPU references; environment variables and fork in
child processes (``--mps-child SCENARIO``), as the pool reads them once. Thread tests run on CPU too (``device``)."""

import copy
import json
import multiprocessing
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.nn as nn

from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize, run_tests, TestCase
from torch.utils._pytree import tree_map


TEST_MPS = torch.backends.mps.is_available()
TEST_STREAM_POOL = TEST_MPS and hasattr(torch.mps, "release_current_thread_slot")  # comes with the pool
WORKER_STREAMS = 31  # all pool slots but the default stream's; see Note [MPS stream pool] in MPSStreamPool.h
POOL_ENV = "MPS_STREAM_POOL_WAIT_TIMEOUT_MS"
GRAPH_ENV = "MPS_FORCE_GRAPH_PATH"
CHILD_FLAG = "--mps-child"
TIMEOUT = 300  # seconds; a hang fails the test instead of blocking the suite


class _Threads:
    r"""Starts ``fn(i)`` for ``i in range(n)``, one new thread each; a raising thread aborts ``barrier``.
    :meth:`join` returns the results in order, or raises the first error a thread raised."""

    def __init__(self, fn, n, barrier=None):
        self.results, self.errors = [None] * n, []

        def body(i):
            try:
                self.results[i] = fn(i)
            except BaseException as exc:
                self.errors.append(exc)
                if barrier is not None:
                    barrier.abort()
        self._threads = [threading.Thread(target=body, args=(i,), name=f"mps-parallel-{i}", daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()

    def join(self):
        deadline = time.monotonic() + TIMEOUT
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if hung := [t.name for t in self._threads if t.is_alive()]:
            raise AssertionError(f"threads still running after {TIMEOUT} s: {hung}")
        if self.errors:
            raise self.errors[0]
        return self.results


def _probe(device, i):
    r"""A few ops on the calling thread's current stream: ``"ok"``, ``"wrong value"`` or the error's message."""
    try:
        x = torch.full((256,), float(i), device=device)
        return "ok" if (x * 2 + 1).sum().item() == 256 * (2 * i + 1) else "wrong value"
    except RuntimeError as exc:
        return str(exc)


class _SelfAttention(nn.MultiheadAttention):
    def forward(self, x):
        return super().forward(x, x, x, need_weights=True)


# name: (model factory, shape of one input, atol and rtol)
MODELS = {
    "linear": (lambda: nn.Linear(256, 128), (4, 256), 1e-4),
    "mlp": (lambda: nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10)),
            (8, 64), 1e-4),
    "conv2d": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, stride=2)),
               (2, 3, 16, 16), 1e-4),
    "layer_norm": (lambda: nn.LayerNorm(64), (4, 16, 64), 1e-4),
    "multihead_attention": (lambda: _SelfAttention(64, 4, batch_first=True), (2, 10, 64), 2e-4),
    "transformer_encoder_layer": (lambda: nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0,
                                                                     batch_first=True), (2, 10, 64), 2e-4),
}


def _check_parallel_forward(name, num_threads, iters, device, seed=0):
    r"""Runs model ``name``, shared, from ``num_threads`` threads at once, each on its own inputs, queueing
    all forwards before reading any back, and compares the outputs with the CPU model's."""
    make_model, shape, tol = MODELS[name]
    torch.manual_seed(seed)
    model = make_model().eval()
    inputs = [[torch.randn(shape) for _ in range(iters)] for _ in range(num_threads)]
    with torch.no_grad():
        expected = [[model(x) for x in xs] for xs in inputs]
    dev_model = copy.deepcopy(model).to(device)
    barrier = threading.Barrier(num_threads, timeout=TIMEOUT)

    def work(t):
        barrier.wait()
        with torch.no_grad():  # grad mode is per thread
            return tree_map(torch.Tensor.cpu, [dev_model(x.to(device)) for x in inputs[t]])
    torch.testing.assert_close(_Threads(work, num_threads, barrier).join(), expected, atol=tol, rtol=tol)


def _chain(x, w, steps):
    r"""``steps`` dependent matmuls that all read ``x``: long enough to race with other streams."""
    y = x
    for _ in range(steps):
        y = torch.tanh(y @ w + x)
    return y


class _DeviceTestCase(TestCase):
    device, iters, needs_pool = "mps", 10, False

    def setUp(self):
        super().setUp()
        if self.device == "mps" and not TEST_MPS:
            self.skipTest("MPS is not available")
        if self.needs_pool and not TEST_STREAM_POOL:
            self.skipTest("needs MPS and PyTorch built with the MPS stream pool")


class _StreamPoolTestCase(_DeviceTestCase):
    needs_pool = True

    def _child(self, *args, env=None):
        r"""Runs a scenario in a fresh interpreter, the pool's variables cleared, then ``env`` set."""
        child_env = {k: v for k, v in os.environ.items() if k not in (POOL_ENV, GRAPH_ENV)} | (env or {})
        cmd = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, *args, "--device", self.device]
        proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=TIMEOUT)
        if proc.returncode != 0 or not proc.stdout.strip():
            self.fail(f"{' '.join(args)} (env {env}) exited with {proc.returncode}\n"
                      f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


@instantiate_parametrized_tests
class TestMPSParallelForward(_DeviceTestCase):
    @parametrize("name", list(MODELS), name_fn=str)  # one test per model: test_linear, ...
    def test(self, name):
        for num_threads in (2, 4, 8, 16):
            with self.subTest(model=name, threads=num_threads):
                _check_parallel_forward(name, num_threads, self.iters, self.device, seed=num_threads)


class TestMPSCrossThread(_DeviceTestCase):
    r"""Tensors made on one thread and used on another, with no synchronization calls."""
    busy_size = 2048  # of the matmuls that keep a stream busy while another thread acts

    def test_pipeline_main_weights_worker_inputs_main_reads(self):
        # Weights written on the main thread, inputs by producers, read by consumers, outputs reused on the main thread.
        model = MODELS["mlp"][0]().eval()
        dev_model = copy.deepcopy(model).to(self.device)
        with torch.no_grad():  # a last write to every weight, queued on the main thread's stream
            for p in (*model.parameters(), *dev_model.parameters()):
                p.mul_(0.5)
        producers, consumers, per_producer = 4, 4, 8
        raw = [torch.randn(8, 64) for _ in range(producers * per_producer)]
        made, outs = queue.Queue(), [None] * len(raw)

        def produce(p):
            for k in range(p, len(raw), producers):
                made.put((k, raw[k].to(self.device) * 2 + 1))

        def consume(_):
            with torch.no_grad():
                while (item := made.get(timeout=TIMEOUT)) is not None:
                    outs[item[0]] = dev_model(item[1])
        consumer_threads = _Threads(consume, consumers)
        _Threads(produce, producers).join()  # producers exit before their outputs are consumed
        for _ in range(consumers):
            made.put(None)
        consumer_threads.join()
        with torch.no_grad():
            ref = [model(x * 2 + 1) for x in raw]
        self.assertEqual([y.cpu() for y in outs], ref, atol=1e-4, rtol=1e-4)
        total = torch.stack(outs).relu().sum(0) * 3  # worker outputs fed into more ops on the main thread
        self.assertEqual(total.cpu(), torch.stack(ref).relu().sum(0) * 3, atol=1e-3, rtol=1e-4)

    def test_in_place_updates_across_threads(self):
        x_cpu = torch.randn(512, 512)
        x = x_cpu.to(self.device, copy=True)
        for _ in range(6):
            _Threads(lambda _: x.mul_(0.5).add_(1), 1).join()  # each thread in turn writes after the last one's write
            x_cpu.mul_(0.5).add_(1)
        self.assertEqual(x.cpu(), x_cpu)

    def test_write_after_read_across_threads(self):
        # A worker overwrites `a` while the main thread's read of it waits behind long work; the read sees the old `a`.
        a_cpu, w_cpu = torch.randn(512, 512), torch.randn(512, 512) / 23
        a, w = a_cpu.to(self.device, copy=True), w_cpu.to(self.device)
        big = (torch.randn(self.busy_size, self.busy_size) / self.busy_size ** 0.5).to(self.device)
        _chain(big, big, 16)
        b = a @ w
        _Threads(lambda _: a.zero_(), 1).join()
        self.assertEqual(b.cpu(), a_cpu @ w_cpu, atol=1e-4, rtol=1e-4)
        self.assertEqual(a.cpu(), torch.zeros(512, 512))

    def test_threads_reading_one_tensor(self):
        # Eight threads at once copy one tensor (also to and from strided views: gather and scatter kernels), multiply
        # it as integers, bitwise-and it, index it (mask, rows) and upsample it bilinearly (Metal kernels; exact for
        # integers): only reads, so no thread waits for another or raises the error for opposite-order stream waits.
        w_cpu, rows_cpu = torch.randint(-9, 10, (64, 64)), torch.tensor([5, 0, 63])
        w, mask, rows = w_cpu.to(self.device), (w_cpu > 0).to(self.device), rows_cpu.to(self.device)
        image = w_cpu[None, None].float().to(self.device)
        barrier = threading.Barrier(8)

        def read(i):
            x = torch.full((64, 64), i, device=self.device)
            barrier.wait(TIMEOUT)
            for _ in range(20):
                outs = (w.clone(), w.to(torch.int32), w.cpu(), x @ w, x & w, w.t().contiguous(),
                        torch.empty_like(w).t().copy_(w), x.masked_fill(mask, -1), w[rows],
                        x.index_copy(0, rows, w[:3]), nn.functional.interpolate(image, scale_factor=2, mode="bilinear"))
            return outs
        for i, outs in enumerate(_Threads(read, 8, barrier).join()):
            x = torch.full((64, 64), i)
            self.assertEqual([o.cpu() for o in outs],
                             [w_cpu, w_cpu.int(), w_cpu, x @ w_cpu, x & w_cpu, w_cpu.t(), w_cpu,
                              x.masked_fill(w_cpu > 0, -1), w_cpu[rows_cpu], x.index_copy(0, rows_cpu, w_cpu[:3]),
                              nn.functional.interpolate(w_cpu[None, None].float(), scale_factor=2, mode="bilinear")])

    def test_outputs_of_exited_threads(self):
        # Threads queue work and exit at once; the main thread reads the results.
        w_cpu = torch.randn(256, 256) / 16
        xs = [torch.randn(256, 256) for _ in range(12)]
        w = w_cpu.to(self.device)
        outs = _Threads(lambda i: _chain(xs[i].to(self.device), w, 4), len(xs)).join()
        self.assertEqual([o.cpu() for o in outs], [_chain(x, w_cpu, 4) for x in xs], atol=1e-4, rtol=1e-4)

    def test_linalg_on_threads_sharing_streams(self):
        # More threads than worker streams factor and solve one system (Apple's kernels, in passes of their own); the
        # main thread then reads each result, which must wait for the pass the kernel ran in.
        a_cpu, b_cpu = torch.randn(64, 64) + 64 * torch.eye(64), torch.randn(64, 4)
        a, b = a_cpu.to(self.device), b_cpu.to(self.device)
        outs = _Threads(lambda _: [(torch.linalg.lu_factor(a).LU, torch.linalg.solve(a, b)) for _ in range(5)],
                        WORKER_STREAMS + 9).join()
        want = (torch.linalg.lu_factor(a_cpu).LU, torch.linalg.solve(a_cpu, b_cpu))
        for pairs in outs:
            self.assertEqual([tree_map(torch.Tensor.cpu, p) for p in pairs], [want] * 5, atol=1e-4, rtol=1e-4)

    def test_backward_on_threads_sharing_weights(self):
        # Threads train one model at once. The autograd engine runs each MPS backward node on a thread of its own,
        # on the stream of the node's forward: each input's gradient is its thread's, the weights' sum them all.
        model = MODELS["mlp"][0]()
        dev_model = copy.deepcopy(model).to(self.device)
        xs = [torch.randn(8, 64) for _ in range(8)]

        def train(m, x, device):
            x = x.to(device, copy=True).requires_grad_()
            m(x).square().sum().backward()
            return x.grad
        grads = _Threads(lambda i: train(dev_model, xs[i], self.device), len(xs)).join()
        want = [train(model, x, "cpu") for x in xs]
        self.assertEqual([g.cpu() for g in grads], want, atol=1e-4, rtol=1e-4)
        self.assertEqual([p.grad.cpu() for p in dev_model.parameters()], [p.grad for p in model.parameters()],
                         atol=1e-3, rtol=1e-4)


class TestMPSThreadChurn(_DeviceTestCase):
    def test_many_short_lived_threads(self):
        for wave in range(16):
            outcomes = _Threads(lambda i: _probe(self.device, wave * 16 + i), 16).join()
            self.assertEqual(outcomes, ["ok"] * 16, f"wave {wave}")
        self.assertEqual(_probe(self.device, 7), "ok")


class TestMPSStreams(_StreamPoolTestCase):
    def test_main_thread_uses_default_stream(self):
        s = torch.mps.current_stream()
        self.assertEqual(s, torch.accelerator.current_stream())
        self.assertEqual(s.device.type, "mps")
        self.assertEqual(s.stream_id, 0)

    def test_concurrent_threads_get_distinct_streams(self):
        barrier = threading.Barrier(8, timeout=TIMEOUT)

        def work(_):
            first = torch.mps.current_stream()
            self.assertEqual(_probe("mps", 1), "ok")
            self.assertEqual(torch.mps.current_stream(), first)
            barrier.wait()  # all threads hold their streams at once
            return first.stream_id
        ids = _Threads(work, 8, barrier).join()
        self.assertEqual(len(set(ids)), 8, ids)
        self.assertNotIn(0, ids)

    def test_release_current_thread_slot(self):
        before = torch.mps.current_stream()
        torch.mps.release_current_thread_slot()  # no-op on the main thread
        self.assertEqual(torch.mps.current_stream(), before)

        def work(i):
            first = _probe("mps", i)
            torch.mps.release_current_thread_slot()
            second = _probe("mps", 1000 + i)  # leases again
            self.assertNotEqual(torch.mps.current_stream().stream_id, 0)
            torch.mps.release_current_thread_slot()
            return first, second
        for wave in range(8):
            self.assertEqual(_Threads(lambda i: work(wave * 16 + i), 16).join(), [("ok", "ok")] * 16)
        self.assertEqual(_probe("mps", 3), "ok")

    def test_stream_context_manager(self):
        x_cpu = torch.randn(64, 64)
        x = x_cpu.to("mps")
        prev = torch.mps.current_stream()
        s1, s2 = torch.Stream(device="mps"), torch.Stream(device="mps")
        self.assertNotEqual(s1, s2)
        with torch.mps.stream(s1):
            self.assertEqual(torch.mps.current_stream(), s1)
            y = x * 2
            with torch.mps.stream(s2):
                self.assertEqual(torch.accelerator.current_stream(), s2)
                z = y + 1
            self.assertEqual(torch.mps.current_stream(), s1)
        self.assertEqual(torch.mps.current_stream(), prev)
        with torch.mps.stream(None):
            self.assertEqual(torch.mps.current_stream(), prev)
        with self.assertRaises(ValueError), torch.mps.stream(s1):
            raise ValueError("leaves the block")
        self.assertEqual(torch.mps.current_stream(), prev)
        prev.wait_stream(s2)
        self.assertEqual(z.cpu(), x_cpu * 2 + 1)

    def test_set_stream_agrees_with_accelerator(self):
        prev = torch.mps.current_stream()
        s = torch.Stream(device="mps")
        try:
            torch.mps.set_stream(s)
            self.assertEqual(torch.accelerator.current_stream(), s)
            torch.accelerator.set_stream(prev)
            self.assertEqual(torch.mps.current_stream(), prev)
        finally:
            torch.mps.set_stream(prev)

    def test_current_stream_is_per_thread(self):
        s_main, s_worker = torch.Stream(device="mps"), torch.Stream(device="mps")
        main_switched, worker_switched = threading.Event(), threading.Event()

        def work(_):
            own = torch.mps.current_stream()
            self.assertTrue(main_switched.wait(TIMEOUT))
            self.assertEqual(torch.mps.current_stream(), own)
            with torch.mps.stream(s_worker):
                worker_switched.set()
                self.assertEqual(torch.mps.current_stream(), s_worker)
                return (torch.ones(8, device="mps") * 3).sum().item()
        worker = _Threads(work, 1)
        with torch.mps.stream(s_main):
            main_switched.set()
            worker_switched.wait(TIMEOUT)
            self.assertEqual(torch.mps.current_stream(), s_main)
            self.assertEqual(worker.join(), [24.0])

    def test_record_stream(self):
        x_cpu, w_cpu = torch.randn(1024, 1024), torch.randn(1024, 1024) / 32
        x, w = x_cpu.to("mps"), w_cpu.to("mps")
        s = torch.Stream(device="mps")
        with torch.mps.stream(s):
            y = _chain(x, w, 8)
        x.record_stream(s)
        del x
        # New blocks on the main thread's stream must not reuse x's memory while s may still read it.
        junk = [torch.full((1024, 1024), 7.0, device="mps") for _ in range(4)]
        torch.mps.current_stream().wait_stream(s)
        self.assertEqual(y.cpu(), _chain(x_cpu, w_cpu, 8), atol=1e-4, rtol=1e-4)
        self.assertEqual(junk[0].cpu(), torch.full((1024, 1024), 7.0))

    def test_event_record_on_one_stream_wait_on_another(self):
        x_cpu, w_cpu = torch.randn(1024, 1024), torch.randn(1024, 1024) / 32
        x, w = x_cpu.to("mps"), w_cpu.to("mps")
        s1, s2, event = torch.Stream(device="mps"), torch.Stream(device="mps"), torch.Event(device="mps")
        with torch.mps.stream(s1):
            a = _chain(x, w, 8)
        event.record(s1)
        s2.wait_event(event)
        with torch.mps.stream(s2):
            b = a * 2 + 1
        s2.synchronize()
        self.assertTrue(event.query())
        self.assertTrue(s1.query())
        torch.mps.current_stream().wait_stream(s2)
        self.assertEqual(b.cpu(), _chain(x_cpu, w_cpu, 8) * 2 + 1, atol=1e-4, rtol=1e-4)

    def test_event_from_worker_thread(self):
        x_cpu, w_cpu = torch.randn(1024, 1024), torch.randn(1024, 1024) / 32

        def produce(_):
            a = _chain(x_cpu.to("mps"), w_cpu.to("mps"), 8)
            event = torch.Event(device="mps")
            event.record()  # on the worker's stream
            return a, event, torch.mps.current_stream()
        (a, event, worker_stream), = _Threads(produce, 1).join()
        self.assertNotEqual(worker_stream, torch.mps.current_stream())
        torch.mps.current_stream().wait_event(event)
        self.assertEqual((a + 1).cpu(), _chain(x_cpu, w_cpu, 8) + 1, atol=1e-4, rtol=1e-4)
        event.synchronize()
        self.assertTrue(event.query())

    def test_device_synchronize_waits_for_every_stream(self):
        for sync in (torch.mps.synchronize, torch.accelerator.synchronize):
            with self.subTest(sync=sync.__module__ + "." + sync.__name__):
                handed, release = queue.Queue(), threading.Event()

                def work(i):
                    x = torch.randn(2048, 2048).to("mps") / 45
                    _chain(x, x, 16)  # long work, left unsynchronized
                    event = torch.Event(device="mps")
                    event.record()
                    handed.put((event, torch.mps.current_stream()))
                    release.wait(TIMEOUT)  # stay alive, holding the stream, without synchronizing
                threads = _Threads(work, 8)
                try:
                    items = [handed.get(timeout=TIMEOUT) for _ in range(8)]
                    sync()
                    self.assertTrue(all(event.query() for event, _ in items))
                    self.assertTrue(all(stream.query() for _, stream in items))
                finally:
                    release.set()
                    threads.join()

    def test_batch_queue_is_exported(self):
        from torch.mps.batch_queue import BatchQueue, batch_inference
        self.assertIs(torch.mps.BatchQueue, BatchQueue)
        self.assertIs(torch.mps.batch_inference, batch_inference)
        model = nn.Linear(32, 8).eval()
        inputs = [torch.randn(32) for _ in range(64)]
        outs = batch_inference(copy.deepcopy(model).to("mps"), inputs, max_batch=16, num_threads=16, device="mps")
        with torch.no_grad():
            expected = [model(x) for x in inputs]
        self.assertEqual([o.cpu() for o in outs], expected, atol=1e-4, rtol=1e-4)


class TestMPSStreamPoolEnvironment(_StreamPoolTestCase):
    r"""Each mode of MPS_STREAM_POOL_WAIT_TIMEOUT_MS, in a fresh process."""

    def test_unset_shares_streams_and_never_fails(self):
        self.assertEqual(self._child("hold", "--threads", "40"), {"ok": 40, "errors": []})

    def test_zero_raises_an_error_naming_the_variable(self):
        result = self._child("hold", "--threads", "40", env={POOL_ENV: "0"})
        self.assertEqual(result["ok"], WORKER_STREAMS)
        self.assertEqual(len(result["errors"]), 40 - WORKER_STREAMS)
        for message in result["errors"]:
            self.assertIn(POOL_ENV, message)
            self.assertIn("release_current_thread_slot", message)

    def test_minus_one_waits_until_a_stream_is_released(self):
        self.assertEqual(self._child("release", "--threads", "40", env={POOL_ENV: "-1"}), {"ok": 40, "errors": []})

    def test_timeout_raises_or_succeeds(self):
        result = self._child("timeout", "--timeout-ms", "1000", env={POOL_ENV: "1000"})  # all worker streams held
        self.assertIn(POOL_ENV, result["first"])
        self.assertGreaterEqual(result["first_ms"], 900)
        self.assertEqual(result["second"], "ok")

    def test_malformed_value_is_a_clear_error(self):
        for value in ("abc", "-2", "1.5", "10ms", "99999999999"):
            with self.subTest(value=value):
                result = self._child("probe", env={POOL_ENV: value})
                self.assertIn(POOL_ENV, result["outcome"])
                self.assertIn(value, result["outcome"])

    def test_churn_returns_every_lease(self):
        # After 256 threads came and went, all worker streams can be leased at once again (the scenario's defaults).
        for release, mode in (("explicit", "0"), ("exit", "-1")):
            with self.subTest(release=release):
                result = self._child("churn", "--release", release, env={POOL_ENV: mode})
                self.assertEqual(result, {"churn_ok": 256, "ok": WORKER_STREAMS, "errors": []})


class TestMPSGraphPath(_StreamPoolTestCase):
    def test_force_graph_path_matches_cpu(self):
        self.assertEqual(self._child("parallel", "--threads", "8", env={GRAPH_ENV: "1"}), dict.fromkeys(MODELS, "ok"))

    def test_layer_norm_graph_fallback_matches_kernel_path(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name, env in (("kernel", {}), ("graph", {GRAPH_ENV: "1"})):  # the Metal-kernel path, the graph path
                self._child("outputs", "--out", os.path.join(tmp, name), env=env)
            kernel, graph = (torch.load(os.path.join(tmp, name)) for name in ("kernel", "graph"))
        self.assertEqual(graph["device"], kernel["device"], atol=1e-5, rtol=1.3e-6)
        self.assertEqual(kernel["device"], kernel["cpu"], atol=1e-5, rtol=1e-5)
        self.assertEqual(graph["device"], graph["cpu"], atol=1e-5, rtol=1e-5)

    def test_malformed_force_graph_path_is_a_clear_error(self):
        for value in ("true", "2", " 1"):
            with self.subTest(value=value):
                self.assertIn(GRAPH_ENV, self._child("graph_probe", env={GRAPH_ENV: value})["outcome"])


class TestMPSFork(_StreamPoolTestCase):
    def test_fork_child_raises_a_clear_error(self):
        result = self._child("fork")
        self.assertEqual(result["exitcode"], 0, result)
        self.assertNotEqual(result["message"], "ok")
        self.assertIn("fork", (result["message"] or "").lower())


def _tally(outcomes):
    return {"ok": outcomes.count("ok"), "errors": [o for o in outcomes if o != "ok"]}


def _child_probe(device):
    return {"outcome": _probe(device, 5)}


def _child_hold(device, threads=8):
    r"""All threads make their first MPS use, then wait for each other: leases are held at once."""
    barrier = threading.Barrier(threads, timeout=TIMEOUT)

    def work(i):
        outcome = _probe(device, i)
        barrier.wait()
        return outcome
    return _tally(_Threads(work, threads, barrier).join())


def _child_release(device, threads=8):
    r"""Threads hold their stream briefly; even ones release it explicitly, odd ones by exiting."""
    def work(i):
        outcome = _probe(device, i)
        time.sleep(0.01)
        if i % 2 == 0 and device == "mps":
            torch.mps.release_current_thread_slot()
        return outcome
    return _tally(_Threads(work, threads).join())


def _child_timeout(device, holders=WORKER_STREAMS, timeout_ms=1000):
    r"""With every worker stream held, a new thread times out; once one is released, one succeeds."""
    ready = threading.Barrier(holders + 1, timeout=TIMEOUT)
    release, finish = threading.Event(), threading.Event()

    def hold(i):
        outcome = _probe(device, i)
        ready.wait()
        if i == 0:
            release.wait(TIMEOUT)
            if device == "mps":
                torch.mps.release_current_thread_slot()
        finish.wait(TIMEOUT)
        return outcome
    holding = _Threads(hold, holders, ready)
    try:
        ready.wait()
        start = time.monotonic()
        (first,) = _Threads(lambda i: _probe(device, 100), 1).join()
        first_ms = (time.monotonic() - start) * 1000
        waiting = _Threads(lambda i: _probe(device, 101), 1)
        time.sleep(timeout_ms / 4000)
        release.set()
        (second,) = waiting.join()
    finally:
        release.set()
        finish.set()
    return {"first": first, "first_ms": first_ms, "second": second, "held_ok": holding.join().count("ok")}


def _child_churn(device, total=256, wave=16, release="explicit", hold=WORKER_STREAMS):
    r"""``total`` short-lived threads (``wave`` at a time), then ``hold`` threads that lease at once."""
    if release not in ("explicit", "exit"):
        raise ValueError(f"release={release!r}: expected 'explicit' or 'exit'")

    def churn(i):
        outcome = _probe(device, i)
        if release == "explicit" and device == "mps":
            torch.mps.release_current_thread_slot()
        return outcome
    outcomes = []
    for start in range(0, total, wave):
        outcomes += _Threads(lambda i: churn(start + i), min(wave, total - start)).join()
    return dict(_child_hold(device, hold), churn_ok=outcomes.count("ok"))


def _child_fork(device):
    r"""Initializes the device here, then runs an op in a fork()ed child process."""
    _probe(device, 1)
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=lambda: sender.send(_probe(device, 2)))
    proc.start()
    sender.close()
    message = receiver.recv() if receiver.poll(TIMEOUT) else None
    proc.join(TIMEOUT)
    return {"message": message, "exitcode": proc.exitcode}


def _child_parallel(device, threads=8, names=MODELS, iters=4):
    r"""Models ``names`` from ``threads`` threads; ``"ok"``, the mismatch or the error per model."""
    result = {}
    for name in names:
        try:
            _check_parallel_forward(name, threads, iters, device)
            result[name] = "ok"
        except (AssertionError, RuntimeError) as exc:  # a mismatch, or an error from a thread or from here
            result[name] = str(exc)
    return result


def _child_outputs(device, out):
    r"""LayerNorm (and Linear) outputs on ``device`` and on CPU, saved to ``out``."""
    torch.manual_seed(0)
    cases = [(nn.LayerNorm(64), (4, 16, 64)), (nn.LayerNorm([8, 32]), (3, 8, 32)),
             (nn.LayerNorm(256, elementwise_affine=False), (2, 256)), (nn.LayerNorm(1024, eps=1e-3), (8, 1024)),
             (nn.Linear(256, 128), (4, 256)), (nn.LayerNorm(48), (5, 48)), (nn.LayerNorm(48), (5, 48))]
    cases[-2][0].bias = None  # a weight without a bias
    cases[-1][0].weight = None  # a bias without a weight
    dev_outs, cpu_outs = [], []
    with torch.no_grad():
        for module, shape in cases:
            for p in module.parameters():  # affine parameters other than the default ones and zeros
                p.uniform_(-2, 2)
            x = torch.randn(shape) * 3 + 1
            cpu_outs.append(module(x))
            dev_outs.append(copy.deepcopy(module).to(device)(x.to(device)).cpu())
    torch.save({"device": dev_outs, "cpu": cpu_outs}, out)
    return {"saved": len(dev_outs)}


def _child_graph_probe(device):
    r"""A Linear and a LayerNorm forward, the ops that read MPS_FORCE_GRAPH_PATH: ``"ok"``, or what failed first."""
    outcomes = _child_parallel(device, 1, ("linear", "layer_norm"), 1).values()
    return {"outcome": next((o for o in outcomes if o != "ok"), "ok")}


def _child_main(argv):
    r"""``SCENARIO [--option value]...``: prints ``_child_SCENARIO(device="mps", option=value, ...)`` as JSON."""
    scenario, *options = argv
    if len(options) % 2 or not all(o.startswith("--") for o in options[::2]):
        raise SystemExit(f"usage: {CHILD_FLAG} SCENARIO [--option value]..., got {argv}")
    kwargs = {"device": "mps"} | {option.removeprefix("--").replace("-", "_"): int(value) if value.isdigit() else value
                                  for option, value in zip(options[::2], options[1::2])}
    result = globals()[f"_child_{scenario}"](**kwargs)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD_FLAG]:
        _child_main(sys.argv[2:])
    else:
        run_tests()
