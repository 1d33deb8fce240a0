"""Tests for fork-overlay/torch/mps/batch_queue.py (loaded by path; runs on any torch >= 1.13, CPU)."""

import collections
import concurrent.futures
import importlib.util
import os
import queue
import threading
import time

import pytest
import torch

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                     "fork-overlay", "torch", "mps", "batch_queue.py")
_spec = importlib.util.spec_from_file_location("batch_queue_under_test", _PATH)
bq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bq)
BatchQueue, batch_inference = bq.BatchQueue, bq.batch_inference

T = 10  # seconds; generous timeout so that a bug fails a test instead of hanging it


class Gated:
    """Model that records batch sizes and blocks in its calls until ``release`` is set."""

    def __init__(self, fn=lambda b: b * 2, gated=True):
        self.fn = fn
        self.sizes = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not gated:
            self.release.set()

    def __call__(self, batch):
        self.sizes.append(len(batch))
        self.entered.set()
        assert self.release.wait(T), "test gate never released"
        return self.fn(batch)


@pytest.fixture
def make_queue():
    """Creates queues that are always released and closed, so a failing test cannot hang."""
    made = []

    def make(model, **kwargs):
        q = BatchQueue(model, **kwargs)
        made.append((q, model))
        return q

    yield make
    for q, model in made:
        if isinstance(model, Gated):
            model.release.set()
        q.close(cancel_pending=True)


def start_blocked(make_queue, model, **kwargs):
    """Returns a queue whose worker is stuck inside the model on one item, plus that item's future."""
    kwargs.setdefault("max_wait_ms", 0)
    q = make_queue(model, **kwargs)
    first = q.submit(torch.full((3,), 100.0))
    assert model.entered.wait(T)
    return q, first


def linear(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(6, 3).eval()


def reference(model, x):
    with torch.no_grad():
        return model(x.unsqueeze(0))[0]


# ---------------------------------------------------------------- correctness

def test_single_thread_matches_reference(make_queue):
    model = linear()
    q = make_queue(model, max_batch=4, max_wait_ms=20)
    xs = [torch.randn(6) for _ in range(10)]
    futs = [q.submit(x) for x in xs]
    for x, f in zip(xs, futs):
        y = f.result(T)
        assert y.shape == (3,)
        torch.testing.assert_close(y, reference(model, x))
    torch.testing.assert_close(q(xs[0], timeout=T), reference(model, xs[0]))
    s = q.stats()
    assert s["submitted"] == s["completed"] == 11 and s["failed"] == 0 and s["batches"] < 11


def test_many_threads_match_reference(make_queue):
    model = linear(1)
    q = make_queue(model, max_batch=8, max_wait_ms=5, max_queue=64)
    n_threads, per_thread = 32, 8
    xs = [[torch.randn(6) for _ in range(per_thread)] for _ in range(n_threads)]
    results = [[None] * per_thread for _ in range(n_threads)]
    errors = []
    barrier = threading.Barrier(n_threads)

    def worker(t):
        try:
            barrier.wait(T)
            for i, x in enumerate(xs[t]):
                results[t][i] = q(x, timeout=T) if i % 2 else q.submit(x, timeout=T).result(T)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * T)
    assert not any(t.is_alive() for t in threads), "submitter threads hung"
    assert not errors, errors
    for t in range(n_threads):
        for i in range(per_thread):
            torch.testing.assert_close(results[t][i], reference(model, xs[t][i]))
    s = q.stats()
    assert s["submitted"] == s["completed"] == n_threads * per_thread
    assert 1 < s["max_batch_size"] <= 8 and s["batches"] < n_threads * per_thread
    assert s["mean_batch_size"] == pytest.approx(n_threads * per_thread / s["batches"])


def test_runs_under_no_grad_and_on_device(make_queue):
    seen = {}

    def model(b):
        seen["grad"], seen["device"] = torch.is_grad_enabled(), b.device
        return b * torch.ones(1, requires_grad=True)

    q = make_queue(model, device="cpu")
    y = q(torch.ones(2), timeout=T)
    assert seen == {"grad": False, "device": torch.device("cpu")} and not y.requires_grad

    # A device other than the inputs' one: the batch is moved, the output is returned where the model left it.
    def meta_model(b):
        seen["device"] = b.device
        return b * 2

    q = make_queue(meta_model, device="meta", max_wait_ms=20)
    futs = [q.submit(torch.ones(2)) for _ in range(3)]
    outs = [f.result(T) for f in futs]
    assert seen["device"].type == "meta" and all(o.device.type == "meta" and o.shape == (2,) for o in outs)


# ---------------------------------------------------------------- batching

def test_batches_respect_max_batch():
    model = Gated()
    with BatchQueue(model, max_batch=4, max_wait_ms=0) as q:
        first = q.submit(torch.zeros(3))
        assert model.entered.wait(T)
        futs = [q.submit(torch.full((3,), float(i))) for i in range(9)]
        model.release.set()
        for i, f in enumerate(futs):
            torch.testing.assert_close(f.result(T), torch.full((3,), 2.0 * i))
        first.result(T)
        s = q.stats()
    # The 9 queued items are already past their deadline, so they run as 4 + 4 + 1.
    assert model.sizes == [1, 4, 4, 1]
    assert s["batches"] == 4 and s["max_batch_size"] == 4 and s["mean_batch_size"] == 2.5


def test_full_batch_does_not_wait_for_deadline(make_queue):
    model = Gated(gated=False)
    q = make_queue(model, max_batch=5, max_wait_ms=3000)
    start = time.monotonic()
    futs = [q.submit(torch.ones(2)) for _ in range(5)]
    for f in futs:
        f.result(T)
    assert time.monotonic() - start < 2.0 and model.sizes == [5]


def test_lone_item_runs_after_max_wait(make_queue):
    q = make_queue(Gated(gated=False), max_batch=8, max_wait_ms=80)
    start = time.monotonic()
    f = q.submit(torch.ones(2))
    f.result(T)
    elapsed = time.monotonic() - start
    assert 0.075 <= elapsed < 2.0, elapsed


# ---------------------------------------------------------------- outputs

def test_tuple_dict_and_namedtuple_outputs(make_queue):
    Pair = collections.namedtuple("Pair", ["a", "b"])
    xs = [torch.randn(4) for _ in range(5)]

    for fn, check in [
        (lambda b: (b + 1, b.sum(1)), lambda x, y: (x + 1, x.sum())),
        (lambda b: [b * 3], lambda x, y: [x * 3]),
        (lambda b: {"s": b.sum(1), "m": b * 2}, lambda x, y: {"s": x.sum(), "m": x * 2}),
        (lambda b: Pair(b, b.max(1)[0]), lambda x, y: Pair(x, x.max())),
    ]:
        model = Gated(fn, gated=False)
        q = make_queue(model, max_batch=8, max_wait_ms=50)
        futs = [q.submit(x) for x in xs]
        outs = [f.result(T) for f in futs]
        assert len(model.sizes) < len(xs)
        for x, y in zip(xs, outs):
            expected = check(x, y)
            assert type(y) is type(expected)
            torch.testing.assert_close(y, expected)


def test_tuple_inputs_are_stacked_fieldwise(make_queue):
    q = make_queue(lambda ab: ab[0] * ab[1], max_wait_ms=20)
    futs = [q.submit((torch.full((2,), float(i)), torch.full((2,), 2.0))) for i in range(4)]
    for i, f in enumerate(futs):
        torch.testing.assert_close(f.result(T), torch.full((2,), 2.0 * i))


def test_custom_collate_and_split(make_queue):
    def collate(xs):
        return torch.cat([x.view(1, -1) for x in xs])

    def split(out, n):
        return [float(v) for v in out.sum(1)]

    q = make_queue(lambda b: b, collate=collate, split=split, max_wait_ms=20)
    futs = [q.submit(torch.full((3,), float(i))) for i in range(4)]
    assert [f.result(T) for f in futs] == [0.0, 3.0, 6.0, 9.0]


# ---------------------------------------------------------------- errors

def test_model_error_fails_only_its_batch(make_queue):
    def fn(b):
        if (b == -1).any():
            raise ValueError("bad sample in batch")
        return b * 2

    model = Gated(fn)
    q, first = start_blocked(make_queue, model, max_batch=3)
    bad = [q.submit(torch.full((3,), v)) for v in (-1.0, 1.0, 2.0)]
    good = [q.submit(torch.full((3,), v)) for v in (3.0, 4.0, 5.0)]
    model.release.set()
    for f in bad:
        with pytest.raises(ValueError, match="bad sample"):
            f.result(T)
    for f, v in zip(good, (3.0, 4.0, 5.0)):
        torch.testing.assert_close(f.result(T), torch.full((3,), 2 * v))
    torch.testing.assert_close(first.result(T), torch.full((3,), 200.0))
    torch.testing.assert_close(q(torch.ones(3), timeout=T), torch.full((3,), 2.0))
    assert model.sizes == [1, 3, 3, 1]
    s = q.stats()
    assert s["failed"] == 3 and s["completed"] == 5


def test_wrong_output_batch_size_is_clear_error(make_queue):
    for fn, got in ((lambda b: b[:1], "batch size 1"), (lambda b: b.sum(), "a 0-dim tensor")):
        model = Gated(fn)
        q, first = start_blocked(make_queue, model)
        futs = [q.submit(torch.ones(3)) for _ in range(3)]
        model.release.set()
        for f in futs:
            with pytest.raises(RuntimeError, match=f"model output has {got} but the batch has 3 inputs"):
                f.result(T)
        if got == "batch size 1":
            first.result(T)  # b[:1] of a batch of 1 is a valid output
        assert model.sizes == [1, 3] and q.stats()["failed"] == 3 + (got != "batch size 1")

    q = make_queue(lambda b: b, split=lambda out, n: [out], max_wait_ms=50)
    futs = [q.submit(torch.ones(2)) for _ in range(2)]
    for f in futs:
        with pytest.raises(RuntimeError, match="split returned 1 results for a batch of 2"):
            f.result(T)


def test_mismatched_shapes_run_in_separate_groups(make_queue):
    model = Gated()
    q, first = start_blocked(make_queue, model)
    xs = [torch.ones(3), torch.ones(5), torch.full((3,), 2.0), torch.full((5,), 3.0), torch.ones(3, dtype=torch.int64)]
    futs = [q.submit(x) for x in xs]
    bad = q.submit("not a tensor")
    model.release.set()
    for x, f in zip(xs, futs):
        torch.testing.assert_close(f.result(T), x * 2)
    with pytest.raises(RuntimeError, match="could not collate 1 input"):
        bad.result(T)
    assert sorted(model.sizes[1:]) == [1, 2, 2]


# ---------------------------------------------------------------- back-pressure

def test_back_pressure(make_queue):
    model = Gated()
    q, first = start_blocked(make_queue, model, max_queue=2)
    queued = [q.submit(torch.ones(3)), q.submit(torch.ones(3))]

    start = time.monotonic()
    with pytest.raises(TimeoutError, match="max_queue=2"):
        q.submit(torch.ones(3), timeout=0.1)
    assert time.monotonic() - start >= 0.09

    start = time.monotonic()
    with pytest.raises(queue.Full, match="queue is full"):
        q.submit(torch.ones(3), block=False)
    assert time.monotonic() - start < 0.09

    late = []
    waiter = threading.Thread(target=lambda: late.append(q.submit(torch.ones(3), timeout=T)), daemon=True)
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive() and not late  # still blocked on the full queue
    model.release.set()
    waiter.join(T)
    for f in [first] + queued + late:
        f.result(T)
    assert len(late) == 1


def test_call_timeout(make_queue):
    model = Gated()
    q, _ = start_blocked(make_queue, model)
    with pytest.raises(concurrent.futures.TimeoutError):
        q(torch.ones(3), timeout=0.05)


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(max_batch=0), ValueError, "max_batch must be a positive int, got 0"),
    (dict(max_batch=2.5), ValueError, "max_batch must be a positive int"),
    (dict(max_batch=True), ValueError, "max_batch must be a positive int"),
    (dict(max_queue=-1), ValueError, "max_queue must be a positive int, got -1"),
    (dict(max_wait_ms=-1), ValueError, "max_wait_ms must be a non-negative number"),
    (dict(max_wait_ms="5"), ValueError, "max_wait_ms must be a non-negative number"),
    (dict(max_wait_ms=float("nan")), ValueError, "max_wait_ms must be a non-negative number"),
    (dict(collate=3), TypeError, "collate must be callable"),
    (dict(split="x"), TypeError, "split must be callable"),
    (dict(name=5), TypeError, "name must be a str"),
    (dict(device="no_such_device"), ValueError, "device must be"),
])
def test_argument_validation(kwargs, exc, message):
    before = threading.active_count()
    with pytest.raises(exc, match="^BatchQueue: " + message):
        BatchQueue(lambda b: b, **kwargs)
    assert threading.active_count() == before  # no worker started


def test_model_and_helper_validation(make_queue):
    for model in (None, 42):
        with pytest.raises(TypeError, match="BatchQueue: model must be callable, got"):
            BatchQueue(model)
    with pytest.raises(ValueError, match="num_threads must be a positive int, got 0"):
        batch_inference(lambda b: b, [torch.ones(1)], num_threads=0)
    q = make_queue(lambda b: b)
    with pytest.raises(ValueError, match="timeout must be"):
        q.submit(torch.ones(1), timeout=-1)


# ---------------------------------------------------------------- shutdown

def worker_alive(name):
    return any(t.name == "BatchQueue-" + name and t.is_alive() for t in threading.enumerate())


def test_close_processes_pending(make_queue):
    model = Gated()
    q, first = start_blocked(make_queue, model, name="drain")
    futs = [q.submit(torch.full((3,), float(i))) for i in range(5)]
    q.close(wait=False)
    assert q.closed
    with pytest.raises(RuntimeError, match="BatchQueue is closed"):
        q.submit(torch.ones(3))
    model.release.set()
    q.close()  # idempotent; waits for the worker
    assert not worker_alive("drain")
    for i, f in enumerate(futs):
        torch.testing.assert_close(f.result(0), torch.full((3,), 2.0 * i))
    assert q.stats()["completed"] == 6


def test_close_cancel_pending(make_queue):
    model = Gated()
    q, first = start_blocked(make_queue, model, name="cancel")
    futs = [q.submit(torch.ones(3)) for _ in range(5)]
    q.close(wait=False, cancel_pending=True)
    model.release.set()
    q.close()
    assert not worker_alive("cancel")
    torch.testing.assert_close(first.result(0), torch.full((3,), 200.0))
    assert all(f.cancelled() for f in futs)
    assert model.sizes == [1] and q.stats()["cancelled"] == 5


def test_caller_cancel_is_skipped(make_queue):
    model = Gated()
    q, first = start_blocked(make_queue, model)
    futs = [q.submit(torch.full((3,), float(i))) for i in range(3)]
    assert futs[1].cancel()
    model.release.set()
    torch.testing.assert_close(futs[0].result(T), torch.zeros(3))
    torch.testing.assert_close(futs[2].result(T), torch.full((3,), 4.0))
    assert model.sizes == [1, 2] and q.stats()["cancelled"] == 1


def test_context_manager_and_concurrent_close():
    model = Gated(gated=False)
    with BatchQueue(model, max_wait_ms=50, name="ctx") as q:
        assert worker_alive("ctx")
        futs = [q.submit(torch.ones(2)) for _ in range(3)]
    assert q.closed and not worker_alive("ctx") and all(f.done() for f in futs)
    with pytest.raises(RuntimeError, match="BatchQueue is closed"):
        q.submit(torch.ones(2))

    q = BatchQueue(model, name="multi")
    assert q._worker.daemon
    closers = [threading.Thread(target=q.close, kwargs=dict(cancel_pending=bool(i % 2))) for i in range(8)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(T)
    assert not any(t.is_alive() for t in closers) and not worker_alive("multi")
    q.close()


def test_close_from_inside_model_does_not_deadlock():
    holder = {}

    def model(b):
        holder["q"].close()  # wait=True from the worker itself must not join itself
        return b

    q = holder["q"] = BatchQueue(model, max_wait_ms=0, name="self_close")
    torch.testing.assert_close(q.submit(torch.ones(2)).result(T), torch.ones(2))
    q.close()
    assert not worker_alive("self_close")


# ---------------------------------------------------------------- batch_inference

def test_batch_inference_order_and_values():
    model = linear(2)
    calls = []

    def counted(b):
        calls.append(len(b))
        return model(b)

    xs = [torch.randn(6) for _ in range(50)]
    outs = batch_inference(counted, xs, max_batch=8, num_threads=4)
    assert len(outs) == 50 and len(calls) < 50 and max(calls) <= 8
    for x, y in zip(xs, outs):
        torch.testing.assert_close(y, reference(model, x))

    outs = batch_inference(model, xs[:7])  # default num_threads = len(inputs)
    for x, y in zip(xs, outs):
        torch.testing.assert_close(y, reference(model, x))
    assert batch_inference(model, []) == []


def test_batch_inference_propagates_model_error():
    def model(b):
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        batch_inference(model, [torch.ones(2)] * 3)
