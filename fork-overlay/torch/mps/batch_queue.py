r"""Dynamic batching: :class:`BatchQueue` runs the samples of many threads as one batch (one command buffer) on a worker
thread, so no thread pays launch, commit and synchronization costs for little arithmetic or contends for the GPU."""

import collections
import concurrent.futures
import numbers
import queue
import threading
import time

import torch
from torch.utils._pytree import tree_map_only

__all__ = ["BatchQueue", "batch_inference"]


class BatchQueueFull(queue.Full, TimeoutError):
    r"""Raised by :meth:`BatchQueue.submit` when no queue slot frees up in time."""


_Item = collections.namedtuple("_Item", ["value", "future", "arrival"])


def _check_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"BatchQueue: {name} must be a positive int, got {value!r}")
    return int(value)


def _check_callable(name, value, optional=True):
    if not callable(value) and not (optional and value is None):
        raise TypeError(f"BatchQueue: {name} must be callable{' or None' if optional else ''}, "
                        f"got {type(value).__name__}")
    return value


def _rebuild(like, values):
    return type(like)(*values) if hasattr(like, "_fields") else type(like)(values)  # namedtuples take fields


def _default_collate(values):
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(values, 0)
    if isinstance(first, dict):
        return {k: _default_collate([v[k] for v in values]) for k in first}
    if isinstance(first, (tuple, list)):
        return _rebuild(first, [_default_collate(list(f)) for f in zip(*values)])
    raise TypeError(f"BatchQueue: cannot stack inputs of type {type(first).__name__}; pass collate=")


def _default_split(output, n):
    if isinstance(output, torch.Tensor):
        if output.dim() == 0 or output.shape[0] != n:
            got = "a 0-dim tensor" if output.dim() == 0 else f"batch size {output.shape[0]}"
            raise RuntimeError(f"BatchQueue: model output has {got} but the batch has {n} inputs; "
                               "the model must keep the batch along dim 0 (or pass split=)")
        return list(output.unbind(0))
    if isinstance(output, dict):
        cols = {k: _default_split(v, n) for k, v in output.items()}
        return [{k: c[i] for k, c in cols.items()} for i in range(n)]
    if isinstance(output, (tuple, list)):
        cols = [_default_split(v, n) for v in output]
        return [_rebuild(output, [c[i] for c in cols]) for i in range(n)]
    if output is None:
        return [None] * n
    raise RuntimeError(f"BatchQueue: cannot split model output of type {type(output).__name__}; pass split=")


def _signature(value):
    r"""Inputs with equal signatures can be collated together."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.device)
    if isinstance(value, (tuple, list, dict)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return (type(value),) + tuple((k, _signature(v)) for k, v in items)
    return type(value)


class BatchQueue:
    r"""Collects single-sample requests from many threads and runs them as batches.

    Each input is one sample without a batch dimension. A daemon worker thread collates queued samples
    (``torch.stack`` along a new dim 0 by default; tuples, lists and dicts field-wise), calls ``model(batch)``
    once under :func:`torch.no_grad` and resolves each future with its sample's views along dim 0 of the
    output's tensors. Inputs that cannot be collated together (e.g. different shapes) run in separate batches.

    Args:
        model (callable): takes a batch, returns a batch of the same size along dim 0.
        max_batch (int): most samples per model call; a full batch runs at once. Default: 8.
        max_wait_ms (float): how long the oldest queued sample waits for more samples before a batch runs. Default: 5.0.
        max_queue (int): number of waiting samples at which :meth:`submit` blocks. Default: 1024.
        device (torch.device or str, optional): where batches are moved for the model; outputs are not moved back.
        collate (callable, optional): ``collate(list_of_inputs) -> batch``.
        split (callable, optional): ``split(output, n) -> sequence of n results``.
        name (str, optional): used in the worker thread's name.

    Example::

        >>> with BatchQueue(torch.nn.Linear(16, 4).eval(), max_batch=32, max_wait_ms=2) as q:
        ...     y = q.submit(torch.randn(16)).result()  # from any thread; shape (4,)
        ...     y2 = q(torch.randn(16))  # blocking form
    """

    def __init__(self, model, *, max_batch=8, max_wait_ms=5.0, max_queue=1024, device=None,
                 collate=None, split=None, name=None):
        self._model = _check_callable("model", model, optional=False)
        self._max_batch = _check_int("max_batch", max_batch)
        self._max_queue = _check_int("max_queue", max_queue)
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, numbers.Real) or not max_wait_ms >= 0:
            raise ValueError(f"BatchQueue: max_wait_ms must be a non-negative number, got {max_wait_ms!r}")
        self._max_wait = float(max_wait_ms) / 1000.0
        try:
            self._device = None if device is None else torch.device(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ValueError(f"BatchQueue: device must be a torch.device or device string, got {device!r}") from exc
        self._collate = _check_callable("collate", collate) or _default_collate
        self._split = _check_callable("split", split) or _default_split
        if name is not None and not isinstance(name, str):
            raise TypeError(f"BatchQueue: name must be a str or None, got {type(name).__name__}")
        # One lock guards _pending, _closed and _counts; both conditions share it.
        self._lock = threading.Lock()
        self._not_empty, self._not_full = threading.Condition(self._lock), threading.Condition(self._lock)
        self._pending, self._closed = collections.deque(), False
        self._counts = collections.Counter(submitted=0, completed=0, failed=0, cancelled=0, batches=0, batched_items=0,
                                           max_batch_size=0)
        self._worker = threading.Thread(target=self._run, name=f"BatchQueue-{name or 'worker'}", daemon=True)
        self._worker.start()

    @property
    def closed(self):
        r"""``True`` once :meth:`close` has been called."""
        return self._closed

    def submit(self, x, *, block=True, timeout=None):
        r"""Queues one sample ``x``; returns a :class:`concurrent.futures.Future` for its output or its batch's error.

        When the queue is full, waits for room up to ``timeout`` s (forever if ``None``, not at all unless ``block``),
        then raises :class:`BatchQueueFull` (a ``queue.Full`` and ``TimeoutError``); ``RuntimeError`` once closed."""
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"BatchQueue: timeout must be a non-negative number or None, got {timeout!r}")
        future = concurrent.futures.Future()
        with self._lock:
            if not self._not_full.wait_for(lambda: self._closed or len(self._pending) < self._max_queue,
                                           timeout if block else 0):
                raise BatchQueueFull(f"BatchQueue: queue is full (max_queue={self._max_queue})"
                                     + (f"; no room within {timeout} s" if block else ""))
            if self._closed:
                raise RuntimeError("BatchQueue is closed")
            self._pending.append(_Item(x, future, time.monotonic()))
            self._counts["submitted"] += 1
            self._not_empty.notify()
        return future

    def __call__(self, x, timeout=None):
        r"""Submits ``x`` and returns its output. ``timeout`` bounds the total wait
        for room and result; on a timeout the sample stays queued and may still run."""
        start, future = time.monotonic(), self.submit(x, timeout=timeout)
        return future.result(None if timeout is None else max(0.0, timeout - (time.monotonic() - start)))

    def close(self, wait=True, cancel_pending=False):
        r"""Stops accepting samples; idempotent and thread-safe. ``wait`` blocks until the worker thread has
        exited; ``cancel_pending`` cancels the queued samples instead of running them (a running batch completes)."""
        with self._lock:
            self._closed = True
            dropped, self._pending = (self._pending, collections.deque()) if cancel_pending else ((), self._pending)
            self._not_empty.notify_all()
            self._not_full.notify_all()
        self._bump(cancelled=sum(item.future.cancel() for item in dropped))
        if wait and threading.current_thread() is not self._worker:
            self._worker.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def stats(self):
        r"""Returns a dict of counters: ``submitted``, ``completed``, ``failed``, ``cancelled``, ``queued``
        (waiting now), ``batches`` (model calls), ``mean_batch_size`` and ``max_batch_size``."""
        with self._lock:
            c = dict(self._counts, queued=len(self._pending))
        c["mean_batch_size"] = c.pop("batched_items") / max(c["batches"], 1)
        return c

    # Worker side. Futures are set running before collation, so a caller can cancel only while its
    # sample is queued; afterwards exactly one of set_result / set_exception is called for it.
    def _run(self):
        items = []
        try:
            while True:
                with self._lock:
                    self._not_empty.wait_for(lambda: self._pending or self._closed)
                    if not self._pending:
                        return  # closed and drained
                    self._not_empty.wait_for(lambda: len(self._pending) >= self._max_batch or self._closed,
                                             self._pending[0].arrival + self._max_wait - time.monotonic())
                    n = min(self._max_batch, len(self._pending))
                    items = [self._pending.popleft() for _ in range(n)]
                    self._not_full.notify(n)
                live = [item for item in items if item.future.set_running_or_notify_cancel()]
                self._bump(cancelled=n - len(live))
                if live:
                    self._run_items(live)
        except BaseException as exc:  # never leave futures unresolved if the worker dies
            with self._lock:
                self._closed = True
                items, self._pending = [*items, *self._pending], collections.deque()
                self._not_full.notify_all()
            err = RuntimeError(f"BatchQueue worker stopped unexpectedly: {exc!r}")
            for item in items:
                if not item.future.cancel() and not item.future.done():
                    item.future.set_exception(err)
            raise

    def _run_items(self, items):
        n, collate_error = len(items), None
        try:
            batch = self._collate([item.value for item in items])
        except Exception as exc:
            groups = {}
            for item in items:
                groups.setdefault(_signature(item.value), []).append(item)
            if len(groups) > 1:  # mixed shapes or dtypes: each compatible group is its own batch
                for group in groups.values():
                    self._run_items(group)
                return
            collate_error = exc
        try:
            if collate_error is not None:
                raise RuntimeError(f"BatchQueue: could not collate {n} input(s) into a batch: "
                                   f"{type(collate_error).__name__}: {collate_error}") from collate_error
            if self._device is not None:
                batch = tree_map_only(torch.Tensor, lambda t: t.to(self._device), batch)
            self._bump(batches=1, batched_items=n)
            with torch.no_grad():
                output = self._model(batch)
            results = list(self._split(output, n))
            if len(results) != n:
                raise RuntimeError(f"BatchQueue: split returned {len(results)} results for a batch of {n} inputs")
        except BaseException as exc:
            for item in items:
                item.future.set_exception(exc)
            return self._bump(failed=n)
        for item, result in zip(items, results):
            item.future.set_result(result)
        self._bump(completed=n)

    def _bump(self, **deltas):
        with self._lock:
            self._counts.update(deltas)  # Counter.update adds
            self._counts["max_batch_size"] = max(self._counts["max_batch_size"], deltas.get("batched_items", 0))


def batch_inference(model, inputs, *, max_batch=8, max_wait_ms=5.0, num_threads=None, device=None):
    r"""Runs ``inputs`` (single samples) through ``model`` with a temporary :class:`BatchQueue` fed by
    ``num_threads`` threads (default: ``min(32, len(inputs))``), emulating many concurrent callers; useful for
    tests and benchmarks. The other arguments are as for :class:`BatchQueue`. Returns one output per input, in
    input order; the first failed sample's exception is re-raised.
    Example::

        >>> outs = batch_inference(torch.nn.Linear(8, 2), [torch.randn(8) for _ in range(100)])
    """
    inputs = list(inputs)
    num_threads = _check_int("num_threads", min(32, max(1, len(inputs))) if num_threads is None else num_threads)
    with (BatchQueue(model, max_batch=max_batch, max_wait_ms=max_wait_ms, device=device, name="batch_inference") as q,
          concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="batch_inference") as pool):
        return [f.result() for f in list(pool.map(q.submit, inputs))]  # every sample queued before any result is read
