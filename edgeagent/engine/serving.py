"""A serving model: one session with its batcher, optional result cache and statistics.

The registry decides *which* versions serve; this module decides *how* one version serves.
The daemon hands the registry a ``ModelFactory`` so the registry never builds batchers or
caches itself (MLServer keeps its registry just as ignorant of its runtimes' internals).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor

import numpy as np

from edgeagent.engine.batcher import Batcher, BatchPolicy, backend_of
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.cache import ResultCache, cache_key
from edgeagent.engine.gate import DeviceGate, LimitsProvider
from edgeagent.engine.limits import UNTHROTTLED
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.plan import ServingPlan, serving_plan
from edgeagent.engine.sequences import SequenceStore
from edgeagent.engine.settings import EngineSettings
from edgeagent.engine.stats import ModelStats
from edgeagent.models.package import ModelPackage
from edgeagent.models.sequence_table import SequenceSpec
from edgeagent.runtimes.base import Session


class LoadedModel:
    """One model version on one backend, with its batcher, optional cache and statistics."""

    def __init__(
        self,
        package: ModelPackage,
        session: Session,
        batcher: Batcher,
        cache: ResultCache | None,
        stats: ModelStats,
        metrics: EngineMetrics,
        plan: ServingPlan | None = None,
    ) -> None:
        self.package = package
        # How this version runs (instances, batch, queue delay) and the figures that chose it.
        self.plan = plan or ServingPlan(
            1, batcher.policy.max_batch_size, batcher.policy.max_queue_delay_s
        )
        self.session = session
        self.stats = stats
        self.cache = cache
        self._batcher = batcher
        self._metrics = metrics
        # Set when a newer version replaced this one: a request that looked this version up
        # just before the swap is answered by the successor instead of failing.
        self.successor: LoadedModel | None = None
        # A stateful model's live sequences (engine.sequences); None for a stateless one.
        self.sequences: SequenceStore | None = None
        # Called after each request this version finished, answered or failed (on the event
        # loop): how the registry judges a canary without doing it inside a lookup.
        self.on_request_done: list[Callable[[], None]] = []

    @property
    def name(self) -> str:
        return self.package.name

    @property
    def version(self) -> str:
        return self.package.version

    @property
    def backend(self) -> dict[str, str]:
        runtime, device, precision = backend_of(self.session)
        return {"runtime": runtime, "device": device, "precision": precision}

    @property
    def max_batch_size(self) -> int:
        """The batch size clients may send (Triton's max_batch_size; 0 = no batch dimension)."""
        return self._batcher.policy.max_batch_size if self._batcher.batching else 0

    @property
    def queued(self) -> int:
        return self._batcher.queued

    async def infer(
        self,
        feeds: Mapping[str, np.ndarray],
        *,
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Validate, answer from the cache or the batcher; raises ServingError subclasses."""
        if self._batcher.closing and self.successor is not None:
            return await self.successor.infer(feeds, priority=priority, timeout_s=timeout_s)
        try:
            return await self._answer(feeds, priority, timeout_s)
        finally:
            for callback in list(self.on_request_done):
                callback()

    async def _answer(
        self, feeds: Mapping[str, np.ndarray], priority: int, timeout_s: float | None
    ) -> dict[str, np.ndarray]:
        if self.cache is None:
            return await self._batcher.submit(feeds, priority=priority, timeout_s=timeout_s)
        started = asyncio.get_running_loop().time()
        key = cache_key(self.version, feeds)
        answer = self.cache.get(key)
        elapsed = int((asyncio.get_running_loop().time() - started) * 1e9)
        self.stats.record_cache(answer is not None, elapsed)
        if answer is not None:
            self._metrics.cache_hits.labels(self.name).inc()
            return dict(answer)
        self._metrics.cache_misses.labels(self.name).inc()
        answer = await self._batcher.submit(feeds, priority=priority, timeout_s=timeout_s)
        self.cache.put(key, answer)
        return answer

    async def close(self, drain_timeout_s: float) -> None:
        """Answer what is queued (within the time-out), then release the session."""
        await self._batcher.close(drain_timeout_s)
        if self.sequences is not None:
            await self.sequences.close()
        await asyncio.get_running_loop().run_in_executor(None, self.session.close)


class ModelFactory:
    """Builds the LoadedModel of a warmed session; one per engine, so all share one DeviceGate."""

    def __init__(
        self,
        settings: EngineSettings,
        *,
        executor: Executor,
        metrics: EngineMetrics,
        load: LoadCounter,
        limits_provider: LimitsProvider = lambda: UNTHROTTLED,
    ) -> None:
        self._settings = settings
        self._executor = executor
        self._metrics = metrics
        self._load = load
        self._limits = limits_provider
        self._gate = DeviceGate()

    @property
    def gate(self) -> DeviceGate:
        """The device gate every batch passes, language models' decode steps included."""
        return self._gate

    def plan(self, package: ModelPackage, session: Session) -> ServingPlan:
        """The session's execution plan under [server] keys where set, else [serving] hints."""
        settings, hints = self._settings, package.serving
        delay_ms = settings.max_queue_delay_ms
        delay_s = (hints.max_queue_delay_ms if delay_ms is None else delay_ms) / 1e3
        return serving_plan(session, settings.max_batch_size or hints.max_batch_size, delay_s)

    def policy(self, package: ModelPackage, session: Session | None = None) -> BatchPolicy:
        """[server] keys where set, else the package's [serving] hints; with ``session``, its
        execution plan's instances and merged batch (the client's limit stays max_batch_size)."""
        settings, hints = self._settings, package.serving
        delay_ms = settings.max_queue_delay_ms
        plan = self.plan(package, session) if session is not None else None
        return BatchPolicy(
            max_batch_size=settings.max_batch_size or hints.max_batch_size,
            max_queue_delay_s=(hints.max_queue_delay_ms if delay_ms is None else delay_ms) / 1e3,
            max_queue=settings.max_queue,
            timeout_s=settings.request_timeout_s,
            default_priority=settings.default_priority,
            adaptive=settings.adaptive_batching,
            instances=plan.instances if plan is not None else 1,
            ahead=_ahead(plan, settings.worker_threads),
            merge_batch_size=plan.batch if plan is not None else None,
        )

    def build(
        self, package: ModelPackage, session: Session, *, stats: ModelStats | None = None
    ) -> LoadedModel:
        """Must run on the event loop: the batcher starts its loop task there. ``stats`` are
        the statistics of the version this one replaces when it is the same version."""
        stats = stats or ModelStats(self._settings.latency_samples)
        plan = self.plan(package, session)
        batcher = Batcher(
            package.name,
            package.version,
            session,
            package.inputs,
            package.outputs,
            self.policy(package, session),
            executor=self._executor,
            gate=self._gate,
            limits=self._limits,
            metrics=self._metrics,
            stats=stats,
            load=self._load,
        )
        size = self._settings.cache_size
        size = package.serving.cache_size if size is None else size
        cache = ResultCache(size) if size > 0 else None
        model = LoadedModel(package, session, batcher, cache, stats, self._metrics, plan)
        if package.sequence is not None:
            model.sequences = self._sequences(package, package.sequence, session)
        return model

    def _sequences(
        self, package: ModelPackage, spec: SequenceSpec, session: Session
    ) -> SequenceStore:
        """The live-sequence store of a stateful model: forked sessions (state inside the
        runtime) run on the shared worker threads through the device gate, like batches."""
        loop = asyncio.get_running_loop()

        async def fork() -> Session:
            return await loop.run_in_executor(self._executor, session.fork)

        async def run_on(own: Session, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            device = backend_of(own)[1]
            await self._gate.acquire(self._limits, device)
            started = time.perf_counter()
            try:
                return await loop.run_in_executor(self._executor, own.run, feeds)
            finally:
                await self._gate.release(device, time.perf_counter() - started)

        async def close(own: Session) -> None:
            await loop.run_in_executor(self._executor, own.close)

        return SequenceStore(
            package,
            spec,
            max_sequences=self._settings.max_sequences,
            idle_timeout_s=self._settings.sequence_idle_timeout_s,
            fork=fork,
            run_on=run_on,
            close_session=close,
        )


def _ahead(plan: ServingPlan | None, worker_threads: int) -> int:
    """Batches formed ahead per instance: one for an instance group (it queues them on its
    instances), when the shared worker threads can hold a waiting batch per instance beside
    the running ones; a formed batch waits on a worker thread, which other models then lack."""
    if plan is None or plan.measured is None:
        return 0
    return 1 if worker_threads >= 2 * plan.instances else 0
