"""Dynamic batching: requests for one model queue and run together.

A model whose every input and output has the same symbolic first dim, which kiln proved
sample-parallel (its size classes: ``kiln.driver.routes``), batches: requests that arrive while a
batch runs queue, and the next run takes every queued request with the same per-sample shapes and
dtypes as the first (so a lone request on an idle model runs at once, and load makes batches by
itself); ``max_queue_delay`` lets the first request also wait that long for company, up to
``max_batch`` samples (at most the dim's declared range, so any total runs on the classes' code
with no compile). Where the model's compute time per batch size was measured when it loaded
(``calibrate``), requests join only up to the largest size that runs cheaper per sample than one
sample alone: on a CPU whose cores one sample already fills, joining would only make requests wait
for each other, so they run one by one. With a latency target, a batch is at most the largest size
whose measured compute fits half the target, and the first request waits for company only as long
as that leaves slack. Joined inputs are concatenated along the first axis, run once, and each
request gets its own rows of every output back. Where the model's sequence length pads and each
sample can have its own valid length (``kiln.driver.ragged``), requests of different lengths join
too: padded to the smallest compiled length that holds the longest, each cut back to its own
(their code compiled when the model loads, ``prepare_joins``). Other models run each request alone, in
order. A joined batch that fails (one request's bad values) runs its requests one by one, so only
the request at fault fails.

The batch runs on a thread of its own (kiln's process-wide pool runs its parallel loops), so the
server's event loop keeps taking requests meanwhile. The queue is bounded: past ``max_queue``
waiting requests, ``QueueFull`` (HTTP 503 with Retry-After).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.ir.types import TensorType
from kiln.passes.batching import Parallel

log = logging.getLogger("kiln")

PAYS = 0.75  # a batch is worth joining where a sample costs at most this much of one run alone (ResNet-50 on
# 2 Zen 4 cores: 0.86-0.95 at batch 8, and joined requests waited for each other: p50 143 vs 81 ms at 18 QPS)


class QueueFull(KilnError):
    """The model's queue is full: the server is busy (HTTP 503)."""


@dataclass
class Timing:
    """Where one request's time went, in seconds."""

    queue: float = 0.0
    compute: float = 0.0
    batch: int = 1


@dataclass
class _Pending:
    feeds: dict[str, np.ndarray]
    rows: int  # samples on the batched axis (0: runs alone)
    key: tuple  # what a request must match to join another
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


def batch_symbol(model: Any) -> str | None:
    """The dim requests of ``model`` may be joined along: the first dim of every output and of the
    inputs that are not static (the static ones must then be the same in every joined request),
    proven sample-parallel without guards (None: each request runs alone)."""
    inputs = [v for v in model.signature.inputs if not (isinstance(v.type, TensorType) and v.type.is_static)]
    values = [*inputs, *model.signature.outputs]
    firsts = {v.type.shape[0] if isinstance(v.type, TensorType) and v.type.shape else None for v in values}
    if len(firsts) != 1:
        return None
    symbol = next(iter(firsts))
    if not isinstance(symbol, str):
        return None
    chunking = getattr(model, "chunking", None)
    found = chunking() if callable(chunking) else None
    if found is None or found.symbol != symbol or not isinstance(found.parallel, Parallel) or found.parallel.guards:
        return None
    return symbol


class Batcher:
    """One model's queue and the task that runs it (see the module's note)."""

    def __init__(
        self,
        model: Any,
        delay_s: float,
        max_batch: int,
        max_queue: int,
        observe: Callable[..., None],
        latency_target_s: float | None = None,
    ):
        self.model = model
        self.symbol = batch_symbol(model)
        static = {v.name for v in model.signature.inputs if isinstance(v.type, TensorType) and v.type.is_static}
        self.batched = [v.name for v in model.signature.inputs if v.name not in static]
        self.fixed = sorted(static)
        high = (getattr(model, "ranges", {}) or {}).get(self.symbol, (1, max_batch))[1] if self.symbol else 1
        self.max_batch = max(1, min(max_batch, high))
        self.delay_s, self.max_queue = delay_s, max_queue
        self.target = latency_target_s
        self.costs: dict[int, float] = {}  # measured compute seconds per batch size (moving average)
        self.calibrated = False  # the curve measured at load (calibrate): batches only where they pay
        # that curve as measured, alone on the machine: whether joining pays is read from it, never
        # from the moving averages (a lone run slowed by the clients' load made batches look cheap)
        self.curve: dict[int, float] = {}
        self.observe = observe  # observe(batch_size, compute_seconds)
        self.queue: deque[_Pending] = deque()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="kiln-serve")
        self.wakeup: asyncio.Event | None = None
        self.task: asyncio.Task | None = None
        self.retired = False  # a newer version serves: end once the queue is empty
        self.ragged: Any = None  # requests of different lengths as one batch, once prepare_joins compiled it
        self.padded_axes: dict[str, int | None] = {}  # then: each input's padded axis (by name)

    def prepare_joins(self) -> bool:
        """Compile what joining requests of different lengths runs (before serving: it compiles);
        False where the model cannot (the reason logged)."""
        if self.symbol is None or not hasattr(self.model, "ragged"):
            return False
        try:
            ragged = self.model.ragged()
        except KilnError as err:
            log.info("requests of different lengths run apart: %s", err)
            return False
        if ragged.batch != self.symbol:
            return False
        try:
            ragged.warm()
        except KilnError as err:  # (a loaded artifact on a machine with no C compiler)
            log.info("requests of different lengths run apart: their code did not compile: %s", err)
            return False
        self.ragged, self.padded_axes = ragged, dict(zip(ragged.names, ragged.padding.inputs))
        return True

    def _shape_key(self, name: str, shape: tuple[int, ...]) -> tuple:
        """What a joined request's input must share with the others: its dims after the batch
        (but for the padded length, where requests of different lengths join)."""
        if self.ragged is None:
            return shape[1:]
        axis = self.padded_axes.get(name)
        return tuple(-1 if i == axis else d for i, d in enumerate(shape) if i > 0)

    def _start(self) -> None:
        if self.task is None:
            self.wakeup = asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(self._worker())

    async def infer(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Timing]:
        """Run one request (checked by the model's signature first: InputError before it queues)."""
        self.model.validate(feeds)
        if self.retired:  # handed out just before a newer version replaced it: run alone, off its queue
            started = time.perf_counter()
            outputs = await asyncio.get_running_loop().run_in_executor(None, self.model.run, feeds)
            return outputs, Timing(0.0, time.perf_counter() - started, 1)
        if len(self.queue) >= self.max_queue:
            raise QueueFull(f"{len(self.queue)} requests are waiting for this model (the limit)")
        self._start()
        rows, key = 0, ()
        if self.symbol is not None:
            batched = [np.asarray(feeds[name]) for name in self.batched]
            rows = int(batched[0].shape[0]) if batched and batched[0].ndim else 0
            fixed = tuple(np.asarray(feeds[name]).tobytes() for name in self.fixed)  # the same in every joined request
            key = (tuple((a.dtype.str, self._shape_key(n, a.shape)) for n, a in zip(self.batched, batched)), fixed)
            if rows > self.max_batch or any(a.ndim == 0 or a.shape[0] != rows for a in batched):
                rows = 0  # (a request larger than a batch runs alone)
        pending = _Pending(feeds, rows, key, asyncio.get_running_loop().create_future())
        self.queue.append(pending)
        assert self.wakeup is not None
        self.wakeup.set()
        return await pending.future

    async def _worker(self) -> None:
        assert self.wakeup is not None
        while not self.retired:
            await self.wakeup.wait()
            self.wakeup.clear()
            while self.queue:
                await self._gather()
                group = self._take()
                if group:
                    await self._run(group)
        self.executor.shutdown(wait=False)  # (retired: every request it held is answered)

    def retire(self) -> None:
        """A newer version took this model's place: answer what is queued, then end (no new
        request reaches a retired batcher: the service no longer hands it out)."""
        self.retired = True
        if self.wakeup is not None:
            self.wakeup.set()
        else:  # never started: nothing queued
            self.executor.shutdown(wait=False)

    def predicted(self, rows: int) -> float | None:
        """The compute time of a batch of ``rows`` from the measured ones (None: nothing measured):
        the measured size itself, else the nearest measured size below scaled by rows (above: by
        rows too, which a batch's per-sample cost only lowers)."""
        if rows in self.costs:
            return self.costs[rows]
        if not self.costs:
            return None
        below = [size for size in self.costs if size < rows]
        size = max(below) if below else min(self.costs)
        return self.costs[size] * rows / size

    def limit(self) -> int:
        """Samples per batch: where the model's curve was measured at load (``calibrate``), the
        largest measured size whose per-sample cost is at most ``PAYS`` of one sample alone (a
        batch that does not run cheaper per sample only makes its requests wait for each other:
        then 1); else ``max_batch``. Under a latency target, also no larger than the largest batch
        whose measured (or extrapolated) compute fits half the target (the other half: waiting for
        the batch before it); at least 1."""
        best = self.max_batch
        if self.calibrated:
            alone = self.curve[1]
            best = max(
                (rows for rows in self.curve if rows <= self.max_batch and self.curve[rows] / rows <= PAYS * alone),
                default=1,
            )
        if self.target is None:
            return best
        fits = 1
        for rows in range(1, best + 1):
            cost = self.predicted(rows)
            if cost is not None and cost <= self.target / 2:
                fits = rows
        return fits

    def calibrate(self, feeds: Callable[[int], dict[str, np.ndarray] | None], rounds: int = 5) -> bool:
        """Measure the model's compute time at batch 1, 2, 4, ... up to ``max_batch`` (``feeds(rows)``:
        inputs of that many samples, None where the model's other dims leave them unknown): the
        curve ``limit`` reads. Runs the model, so it is called before serving (or on a worker
        thread). False when the curve could not be measured."""
        if self.symbol is None or feeds(1) is None:
            return False
        rows = 1
        while rows <= self.max_batch:
            inputs = feeds(rows)
            assert inputs is not None
            self.model.run(inputs)  # (the first: warms the size's code)
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                self.model.run(inputs)
                times.append(time.perf_counter() - started)
            self.costs[rows] = self.curve[rows] = sorted(times)[len(times) // 2]
            rows *= 2
        self.calibrated = True
        return True

    def delay(self, limit: int) -> float:
        """How long the first request waits for company: the configured delay, or under a latency
        target the slack a full batch leaves in the target's first half."""
        if self.target is None:
            return self.delay_s
        cost = self.predicted(limit)
        return 0.0 if cost is None else max(0.0, min(self.target / 2 - cost, self.target / 4))

    async def _gather(self) -> None:
        """Wait for the first request's delay to pass, or for a full batch."""
        first = self.queue[0]
        limit = self.limit()
        delay = self.delay(limit)
        if not first.rows or delay <= 0:
            return
        while True:
            waiting = sum(p.rows for p in self.queue if p.key == first.key and p.rows)
            left = first.enqueued + delay - time.perf_counter()
            if waiting >= limit or left <= 0 or first.future.done():
                return
            await asyncio.sleep(min(left, 0.0005))

    def _take(self) -> list[_Pending]:
        first = self.queue.popleft()
        if first.future.done():  # timed out or cancelled while it waited
            return []
        group, rows, limit = [first], first.rows, self.limit()
        if first.rows:
            kept: deque[_Pending] = deque()
            while self.queue:
                pending = self.queue.popleft()
                if pending.future.done():
                    continue
                if pending.rows and pending.key == first.key and rows + pending.rows <= limit:
                    group.append(pending)
                    rows += pending.rows
                else:
                    kept.append(pending)
            self.queue = kept
        return group

    async def _run(self, group: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            if len(group) == 1:
                outputs = [await loop.run_in_executor(self.executor, self.model.run, group[0].feeds)]
            elif self.ragged is not None and len({self.ragged.length_of(p.feeds) for p in group}) > 1:
                requests = [p.feeds for p in group]
                outputs = await loop.run_in_executor(self.executor, self.ragged.run, requests)
            else:
                joined = {name: np.concatenate([p.feeds[name] for p in group]) for name in self.batched}
                joined.update({name: group[0].feeds[name] for name in self.fixed})
                whole = await loop.run_in_executor(self.executor, self.model.run, joined)
                outputs = _split(whole, [p.rows for p in group])
        except Exception as err:  # (anything: the worker task must outlive every request)
            if len(group) == 1 or not isinstance(err, KilnError):
                for pending in group:
                    if not pending.future.done():
                        pending.future.set_exception(err)
                return
            for pending in group:  # one request's values failed the batch: each alone, so only it fails
                await self._run([pending])
            return
        compute = time.perf_counter() - started
        rows = sum(p.rows for p in group)
        self.observe(rows or 1, compute)
        if rows:  # (a request that runs alone unbatched is no point of the batch-size curve)
            known = self.costs.get(rows)
            self.costs[rows] = compute if known is None else 0.7 * known + 0.3 * compute
        for pending, result in zip(group, outputs):
            if not pending.future.done():
                pending.future.set_result((result, Timing(started - pending.enqueued, compute, rows or 1)))

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.executor.shutdown(wait=True)


def _split(outputs: dict[str, np.ndarray], rows: list[int]) -> list[dict[str, np.ndarray]]:
    bounds = np.cumsum([0, *rows])
    return [{name: array[bounds[i] : bounds[i + 1]] for name, array in outputs.items()} for i in range(len(rows))]
