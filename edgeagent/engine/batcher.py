"""Dynamic batching: concurrent requests to one model version are merged into batches.

One ``Batcher`` per loaded model version owns a bounded, priority-ordered queue and one loop
task. The loop takes the most urgent request, waits at most ``max_queue_delay`` for more rows of
the same shape (with ``adaptive``, only after a batch that served several requests, so a lone
client is never delayed), runs the batch on a worker thread (runtimes release the GIL) and
splits the output rows back by each request's offset. With one execution instance
(``BatchPolicy.instances``) it forms the next batch only then — a session is never run from two
threads at once; with N instances (an ``InstanceGroup``, one session each) up to N batches run
at once, so the next batch forms and runs while the previous one finishes and no core idles
between batches; unthrottled, one more batch per instance is formed ahead and waits on its
instance (``BatchPolicy.ahead``), which then starts it the moment it finishes instead of idling
until the loop, busy with other requests' HTTP, forms one (at c=16, batch 1: +14 % served);
a more urgent request arriving later waits for at most that one batch. A request that finds
the queue full goes, alone and at once, to a peer instance with nothing reserved on it
(``spare_peer``) when there is one, instead of being refused. Before every batch it
reads the governor's ``ServingLimits`` (batch cap, concurrency, pacing, shedding, low-power
mode), so a throttle takes effect within one batch; paced or capped, nothing is formed ahead.

Every answer must belong to its own request (MLServer shipped batches answered with another
request's rows): requests keep their own futures and row offsets, outputs whose first dimension
does not equal the batch's row count fail the batch instead of being guessed at.

A little over 500 lines, on purpose: the queue, the loop, the batches formed ahead and the
instances that run them are one state machine over one queue, and its invariants (a session
never run from two threads, every answer to its own request) are read in one place.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import Counter, Histogram

from edgeagent.aio import spawn
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.errors import (
    DeadlineExceeded,
    InvalidInput,
    NotReady,
    QueueFull,
    ServingError,
    Throttled,
)
from edgeagent.engine.feeds import Answer, can_batch, concat_feeds, split_outputs, validate_feeds
from edgeagent.engine.gate import DeviceGate, LimitsProvider
from edgeagent.engine.limits import ServingLimits
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.stats import ModelStats
from edgeagent.hardware.instances import Placement, offloads, spare_peer
from edgeagent.models.package import TensorSpec
from edgeagent.runtimes.base import Backend, Session, is_managed
from edgeagent.runtimes.remote import is_remote

log = logging.getLogger(__name__)

_ERROR_KINDS = {
    InvalidInput: "invalid_input",
    QueueFull: "queue_full",
    Throttled: "throttled",
    DeadlineExceeded: "deadline",
    NotReady: "not_ready",
}


# Failures that count against a model version (a canary is rolled back for them); the others
# are the client's doing (bad input) or deliberate (queue full, shed, shutting down).
SERVER_FAULTS = frozenset({"failed", "deadline"})


def error_kind(error: BaseException) -> str:
    """The ``kind`` label of the errors metric for an exception."""
    return _ERROR_KINDS.get(type(error), "failed")


def backend_of(session: Session) -> tuple[str, str, str]:
    """(runtime, device, precision) that runs now; a ManagedSession reports its candidate."""
    source: Backend = session
    if is_managed(session) and session.candidate is not None:
        source = session.candidate
    return source.runtime, source.device, source.precision


@dataclass(frozen=True)
class BatchPolicy:
    """How one model version is batched; built from model.toml [serving] and [server]."""

    max_batch_size: int  # rows merged into one batch; 1 = no merging
    max_queue_delay_s: float  # longest a request waits for company
    max_queue: int  # waiting requests before QueueFull
    timeout_s: float  # deadline of a request that sets none
    default_priority: int  # priority of a request that sets none (1 = most urgent)
    adaptive: bool = True  # wait for company only after a batch that served several requests
    instances: int = 1  # batches run at once (the execution plan's instances)
    ahead: int = 0  # batches formed per instance while it runs one (instances that queue them)
    merge_batch_size: int | None = None  # rows merged from several requests; None = max_batch


@dataclass(frozen=True)
class _Series:
    """One backend's labelled metric children: ``labels()`` costs a lock and a dict lookup
    each, and a batch would otherwise make seven of them."""

    queue_wait: Histogram
    batch_size: Histogram
    compute: Histogram
    busy: Counter
    requests: Counter
    latency: Histogram

    @classmethod
    def of(cls, metrics: EngineMetrics, model: str, version: str, backend: str) -> _Series:
        return cls(
            queue_wait=metrics.queue_wait.labels(model),
            batch_size=metrics.batch_size.labels(model, backend),
            compute=metrics.compute.labels(model, backend),
            busy=metrics.busy.labels(model, backend),
            requests=metrics.requests.labels(model, version, backend),
            latency=metrics.latency.labels(model, version, backend),
        )


@dataclass(eq=False)
class _Request:
    feeds: Mapping[str, np.ndarray]
    rows: int
    signature: tuple
    priority: int
    seq: int
    enqueued: float
    future: asyncio.Future = field(repr=False)

    @property
    def order(self) -> tuple[int, int]:
        return (self.priority, self.seq)


class Batcher:
    """The queue and batch loop of one model version (see the module docstring)."""

    def __init__(
        self,
        model: str,
        version: str,
        session: Session,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        policy: BatchPolicy,
        *,
        executor: Executor,
        gate: DeviceGate,
        limits: LimitsProvider,
        metrics: EngineMetrics,
        stats: ModelStats,
        load: LoadCounter,
    ) -> None:
        self.model = model
        self.version = version
        self.session = session
        self.inputs = tuple(inputs)
        self.batching = can_batch(inputs, outputs) and policy.max_batch_size > 1
        self.policy = policy
        self._executor = executor
        self._gate = gate
        self._limits = limits
        self._metrics = metrics
        self._stats = stats
        self._load = load
        self._pending: list[_Request] = []
        self._seq = itertools.count()
        self._arrived = asyncio.Event()
        self._closing = False
        self._low_power = False
        self._last_batch_requests = 0
        self._series_by_backend: dict[str, _Series] = {}
        # Batches formed and not yet finished: one per instance, and ``ahead`` more per
        # instance waiting on it, so an instance that finishes starts its next batch at once
        # instead of idling until the loop has formed one (between HTTP work for 16 clients).
        self._free = asyncio.Semaphore(max(1, policy.instances) * (1 + max(0, policy.ahead)))
        self._executing = 0
        self._finished = asyncio.Event()
        self._running: set[asyncio.Task] = set()  # batches on worker threads
        self._task = spawn(self._loop(), name=f"batch:{model}")  # a dead loop is logged

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def queued(self) -> int:
        return len(self._pending)

    async def submit(
        self,
        feeds: Mapping[str, np.ndarray],
        *,
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> Answer:
        """Queue one request and wait for its own rows of the batch output."""
        started = time.monotonic()
        try:
            return await self._submit(feeds, priority, timeout_s, started)
        except ServingError as exc:
            self._metrics.errors.labels(self.model, error_kind(exc)).inc()
            self._stats.record_request(
                False,
                int((time.monotonic() - started) * 1e9),
                server_fault=error_kind(exc) in SERVER_FAULTS,
            )
            raise

    async def _submit(
        self, feeds: Mapping[str, np.ndarray], priority: int, timeout_s: float | None, started
    ) -> Answer:
        if self._closing:
            raise NotReady(f"model {self.model!r} version {self.version} is shutting down")
        rows, signature = validate_feeds(self.model, self.inputs, feeds, self.batching)
        if self.batching and rows > self.policy.max_batch_size:
            raise InvalidInput(
                f"model {self.model!r}: a batch of {rows} rows exceeds its max_batch_size "
                f"{self.policy.max_batch_size}"
            )
        priority = priority if priority > 0 else self.policy.default_priority
        limits = self._limits()
        if _shed(limits, priority) and not offloads(self.session):
            raise _throttled(self.model, limits)
        spare = None
        if len(self._pending) >= self.policy.max_queue:
            spare = spare_peer(self.session, rows)  # a full queue overflows to an idle peer
            if spare is None:
                raise QueueFull(
                    f"model {self.model!r}: {len(self._pending)} requests are already waiting "
                    f"([server] max_queue = {self.policy.max_queue}); retry later"
                )
        request = _Request(
            feeds=feeds,
            rows=rows,
            signature=signature,
            priority=priority,
            seq=next(self._seq),
            enqueued=started,
            future=asyncio.get_running_loop().create_future(),
        )
        if spare is not None:
            self._track(spawn(self._run_overflow(request, spare), name=f"overflow:{self.model}"))
        else:
            bisect.insort(self._pending, request, key=lambda r: r.order)
            self._arrived.set()
        timeout = self.policy.timeout_s if timeout_s is None else timeout_s
        # A timer on the request's own future rather than asyncio.wait_for, whose extra waiter
        # future costs every request one more trip round the event loop.
        deadline = request.future.get_loop().call_later(timeout, self._expire, request, timeout)
        try:
            return await request.future
        finally:
            deadline.cancel()

    def _expire(self, request: _Request, timeout: float) -> None:
        """The request's deadline passed: it fails now, and a batch skips it (``done()``)."""
        if not request.future.done():
            request.future.set_exception(
                DeadlineExceeded(
                    f"model {self.model!r} did not answer within {timeout:g} s "
                    f"({len(self._pending)} requests waiting); the device is overloaded or "
                    "throttled"
                )
            )

    async def close(self, drain_timeout_s: float) -> None:
        """Stop taking requests, answer the queued ones within the time-out, fail the rest."""
        self._closing = True
        self._arrived.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), drain_timeout_s)
        except asyncio.TimeoutError:
            self._fail_pending(
                NotReady(f"model {self.model!r}: shut down before this request could run")
            )
            await self._task  # the batch already on a worker thread always runs to its end
        await asyncio.gather(*self._running, return_exceptions=True)  # overflow in flight

    def _fail_pending(self, error: ServingError) -> None:
        for request in self._pending:
            if not request.future.done():
                request.future.set_exception(error)
        self._pending.clear()

    async def _loop(self) -> None:
        try:
            while True:
                self._drop_abandoned()
                if not self._pending:
                    if self._closing:
                        return
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                await self._free.acquire()  # an instance is idle (or will be): form its batch
                await self._until_an_instance_is_idle()
                started = False
                try:
                    started = await self._start_batch()
                finally:
                    if not started:
                        self._free.release()
        finally:  # the batches already on worker threads always run to their end
            await asyncio.gather(*self._running, return_exceptions=True)

    async def _start_batch(self) -> bool:
        """Form one batch and start it on the idle instance; False when none was formed."""
        limits = self._limits()
        self._shed_queued(limits)
        cap = self._cap(limits)
        await self._fill(cap)
        await self._set_power_mode(limits.prefer_low_power)
        rows = min(cap, self._ready_rows(self._pending[0].signature)) if self._pending else 1
        queued = sum(r.rows for r in self._pending)  # the instance and its device, then its turn
        placement = await self._gate.admit(self.session, self._limits, rows, queued - rows)
        batch = self._take(self._cap(self._limits()))
        if not batch:
            placement.cancel()
            await self._gate.release(placement.device, 0.0)  # nothing ran: no device time
            return False
        self._executing += 1
        self._track(spawn(self._run_batch(batch, placement), name=f"batch-run:{self.model}"))
        return True

    def _track(self, task: asyncio.Task) -> None:
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run_overflow(self, request: _Request, placement: Placement) -> None:
        """A request the full queue could not take, run alone on the idle peer instance
        reserved for it (``spare_peer``): admitted to the peer's device, never this board's."""
        try:
            await self._gate.acquire(self._limits, placement.device)
        except BaseException:
            placement.cancel()
            raise
        busy_s: float | None = None
        try:
            busy_s = await self._execute([request], placement)
        finally:
            placement.cancel()
            await self._gate.release(placement.device, busy_s)

    async def _until_an_instance_is_idle(self) -> None:
        """While the governor paces batches or caps their concurrency, form a batch only for
        an idle instance: one formed ahead would start when its instance frees, not when the
        gate admitted it, so two could start closer together than the pacing allows."""
        while self._executing >= max(1, self.policy.instances) and _throttles(self._limits()):
            self._finished.clear()
            await self._finished.wait()

    async def _run_batch(self, batch: list[_Request], placement: Placement) -> None:
        """One batch on one instance; frees the gate and the instance whatever happens."""
        busy_s: float | None = None
        try:
            busy_s = await self._execute(batch, placement)
        finally:
            placement.cancel()  # a no-op once the batch ran
            await self._gate.release(placement.device, busy_s)  # pacing charges what it used
            self._executing -= 1
            self._finished.set()
            self._free.release()

    def _cap(self, limits: ServingLimits) -> int:
        if not self.batching:
            return 1
        cap = self.policy.merge_batch_size or self.policy.max_batch_size
        if limits.max_batch_size is not None:
            cap = min(cap, limits.max_batch_size)
        return max(1, cap)

    def _drop_abandoned(self) -> None:
        """Forget requests whose caller gave up (deadline, disconnect) before they ran."""
        if any(r.future.done() for r in self._pending):
            self._pending = [r for r in self._pending if not r.future.done()]

    def _shed_queued(self, limits: ServingLimits) -> None:
        """Requests queued before the governor started shedding are shed now, not run."""
        if limits.shed_priority_from is None or offloads(self.session):
            return
        for request in self._pending:
            if _shed(limits, request.priority) and not request.future.done():
                request.future.set_exception(_throttled(self.model, limits))
        self._drop_abandoned()

    def _ready_rows(self, signature: tuple) -> int:
        return sum(r.rows for r in self._pending if r.signature == signature)

    async def _fill(self, cap: int) -> None:
        """Wait until the head's batch is full or its queue delay is spent.

        Only under concurrency: when the last batch served a single request, company is not
        expected, and waiting would add the whole delay to every request of a lone client.
        """
        if not self._pending or self._closing:
            return
        if self.policy.adaptive and self._last_batch_requests < 2:
            return
        head = self._pending[0]
        until = head.enqueued + self.policy.max_queue_delay_s
        while self._ready_rows(head.signature) < cap and not self._closing:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _take(self, cap: int) -> list[_Request]:
        """The head request plus following ones of its shape, up to ``cap`` rows in all."""
        self._drop_abandoned()
        if not self._pending:
            return []
        head = self._pending[0]
        batch, rest, rows = [head], [], head.rows
        for request in self._pending[1:]:
            if request.signature == head.signature and rows + request.rows <= cap:
                batch.append(request)
                rows += request.rows
            else:
                rest.append(request)
        self._pending = rest
        return batch

    async def _set_power_mode(self, low: bool) -> None:
        """Follow the governor's prefer_low_power on sessions that can switch (ResilientSession)."""
        if low == self._low_power or not is_managed(self.session):
            return
        self._low_power = low
        switch = self.session.set_power_mode
        mode = "low" if low else "high"
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, switch, mode)
            log.info("model %s: power mode %s", self.model, mode)
        except Exception:
            log.exception("model %s: switching to power mode %s failed", self.model, mode)

    def _series(self, session: Session) -> _Series:
        """The labelled metrics of the backend that runs now (it changes on failover)."""
        backend = ":".join(backend_of(session))
        series = self._series_by_backend.get(backend)
        if series is None:
            series = self._series_by_backend[backend] = _Series.of(
                self._metrics, self.model, self.version, backend
            )
        return series

    async def _execute(self, batch: list[_Request], placement: Placement) -> float | None:
        """Run the batch and answer its requests; the device seconds it took (None: failed)."""
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        series = self._series(placement.session)
        for request in batch:
            series.queue_wait.observe(start - request.enqueued)
        try:
            answers, (input_ns, infer_ns, output_ns) = await loop.run_in_executor(
                self._executor, self._compute, batch, placement
            )
        except Exception as exc:
            log.warning("model %s: batch of %d failed: %s", self.model, len(batch), exc)
            error = ServingError(f"model {self.model!r} failed to run: {exc}")
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(error)
            return None
        self._last_batch_requests = len(batch)
        rows = sum(r.rows for r in batch)
        self._stats.record_batch(rows, len(batch), input_ns, infer_ns, output_ns)
        series.batch_size.observe(rows)
        series.compute.observe(infer_ns / 1e9)
        busy_s = (input_ns + infer_ns + output_ns) / 1e9
        series.busy.inc(busy_s)
        if not is_remote(placement.device):  # a peer's work heats the peer, not this board
            self._load.record_batch(busy_s)
        end = time.monotonic()
        for request, answer in zip(batch, answers, strict=True):
            if request.future.done():  # the caller's deadline passed while it ran
                continue
            request.future.set_result(answer)
            series.requests.inc()
            series.latency.observe(end - request.enqueued)
            self._stats.record_request(
                True,
                int((end - request.enqueued) * 1e9),
                int((start - request.enqueued) * 1e9),
                service_ns=input_ns + infer_ns + output_ns,
            )
        return busy_s

    def _compute(
        self, batch: list[_Request], placement: Placement
    ) -> tuple[list[Answer], tuple[int, int, int]]:
        """Worker thread: concatenate, run on the placed instance, split by row offsets."""
        t0 = time.perf_counter_ns()
        feeds = concat_feeds(self.inputs, [r.feeds for r in batch])
        t1 = time.perf_counter_ns()
        outputs = placement.run(feeds)
        t2 = time.perf_counter_ns()
        answers = split_outputs(outputs, [r.rows for r in batch])
        t3 = time.perf_counter_ns()
        return answers, (t1 - t0, t2 - t1, t3 - t2)


def _throttles(limits: ServingLimits) -> bool:
    """Whether the governor paces batches or caps how many run at once."""
    return limits.duty_cycle < 1.0 or limits.max_concurrency is not None


def _shed(limits: ServingLimits, priority: int) -> bool:
    return limits.shed_priority_from is not None and priority >= limits.shed_priority_from


def _throttled(model: str, limits: ServingLimits) -> Throttled:
    why = limits.reason or "the device is throttled"
    return Throttled(
        f"model {model!r}: request shed by the power/thermal governor ({why}); "
        f"retry after {limits.retry_after_s} s",
        retry_after=max(1, math.ceil(limits.retry_after_s)),
    )
