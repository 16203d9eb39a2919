"""Continuous batching: one loop drives one generative session, a decode step at a time.

Every step the loop (on the event loop) ends what was cancelled, shed or past its deadline,
admits waiting sequences by priority while a slot and the KV budget allow, and builds one
batch: the next token of every running sequence plus prompt chunks of new ones (at most
``[llm] prefill_chunk`` prompt tokens a step, so running streams keep flowing while a long
prompt is read). The device gate admits the step like a vision batch (the governor's
concurrency cap and duty-cycle pacing), then the session's own thread frees KV, copies shared
prefixes, decodes, samples and assembles text; the loop hands the chunks to each stream.

A runtime that samples inside (``GeneratingSession``: OpenVINO GenAI) is driven the same way
one level up: a sequence's whole generation begins when it is admitted, and each step
advances every running one by one step of the runtime's own batching; admission, the budget,
deadlines, stop strings, cancellation and metrics stay here.

A sequence is admitted only when its whole worst case (prompt + max_tokens) fits the KV
budget with everyone else's, so a running sequence never runs out of cache mid-answer; what
does not fit waits, and a full waiting queue answers 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from edgeagent.aio import spawn
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.errors import DeadlineExceeded, NotReady, QueueFull, ServingError, Throttled
from edgeagent.engine.gate import DeviceGate, LimitsProvider
from edgeagent.engine.language.metrics import LanguageMetrics
from edgeagent.engine.language.prefix import Retained, best_source
from edgeagent.engine.language.sampling import Sampler
from edgeagent.engine.language.sequence import SequenceState, StepEvent
from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.engine.language.stream import GenerationStream
from edgeagent.engine.language.text import TextAssembler
from edgeagent.engine.language.whole import advance
from edgeagent.engine.text_requests import FINISH_LENGTH, FINISH_STOP, Sampling, TextChunk, Usage
from edgeagent.runtimes.generative import GeneratingSession, GenerativeSession, SequenceInput

log = logging.getLogger(__name__)
MIB = 1 << 20
T = TypeVar("T")


class Scheduler:
    """The continuous-batching loop of one loaded model version."""

    def __init__(
        self,
        session: GenerativeSession,
        *,
        model: str,
        settings: LanguageSettings,
        stop: tuple[str, ...],
        gate: DeviceGate,
        limits: LimitsProvider,
        load: LoadCounter,
        metrics: LanguageMetrics,
        timeout_s: float,
        default_priority: int,
    ) -> None:
        self.session = session
        # A runtime that samples itself: whole generations, its own prefix cache.
        self._generating = session if isinstance(session, GeneratingSession) else None
        self.model = model
        self.device = getattr(session, "device", "CPU")
        self._settings = settings
        self._stop = stop
        self._gate, self._limits, self._load = gate, limits, load
        self._metrics = metrics
        self._timeout_s, self._default_priority = timeout_s, default_priority
        _, allocated = session.kv_bytes()
        self._per_token = max(1, allocated // max(1, session.context))
        # KV tokens the budget allows: the context, or fewer when cache_mib is smaller.
        self.capacity = min(session.context, settings.cache_mib * MIB // self._per_token)
        self.sequence_context = min(self.capacity, session.facts.context_trained)
        self._free_slots = list(range(session.sequences))
        self._waiting: list[SequenceState] = []
        self._running: dict[int, SequenceState] = {}
        self._retained = Retained()
        self._frees: list[int] = []
        self._copies: list[tuple[int, int, int]] = []
        self._order = itertools.count()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"edgeagent-llm-{model}")
        self._wake = asyncio.Event()
        self._closing = False
        self._mean_s = 1.0  # a generation's mean duration, for Retry-After
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self.kv = session.kv_bytes()  # (used, allocated) after the last step
        self._tick: asyncio.Future[None] | None = None
        self._idle = False  # parked with nothing to do

    # ---- admission (the plane calls these) -------------------------------------------------

    def start(self) -> None:
        self._task = spawn(self._guarded(), name=f"llm-{self.model}")

    async def _guarded(self) -> None:
        """The loop; should it ever fail, every stream hears why and new requests get 503."""
        try:
            await self._run()
        except Exception as exc:
            log.exception("the scheduler of %s stopped", self.model)
            self._closing = True
            failure = NotReady(f"model {self.model!r}: its scheduler stopped: {exc}")
            for sequence in [*self._waiting, *self._running.values()]:
                sequence.stream.fail(failure)
            self._waiting.clear()
            self._running.clear()
            raise

    async def submit(
        self,
        prompt: list[int],
        sampling: Sampling,
        max_tokens: int,
        priority: int | None,
        timeout_s: float | None,
    ) -> GenerationStream:
        """Queue a sequence and wait until it holds a slot; refusals raise before any chunk."""
        if self._closing:
            raise NotReady(f"model {self.model!r} is unloading", retry_after=1)
        priority = priority if priority and priority > 0 else self._default_priority
        limits = self._limits()
        if limits.shed_priority_from is not None and priority >= limits.shed_priority_from:
            raise Throttled(
                f"model {self.model!r}: priority {priority} requests are shed now "
                f"({limits.reason or 'governor'})",
                limits.retry_after_s,
            )
        if len(self._waiting) >= self._settings.queue:
            raise QueueFull(
                f"model {self.model!r}: {len(self._waiting)} requests already wait for one of "
                f"{self.session.sequences} sequences ([llm] queue)",
                retry_after=self.retry_after(),
            )
        now = time.monotonic()
        stream = GenerationStream(self._wake.set)
        sequence = SequenceState(
            prompt=prompt,
            max_tokens=max_tokens,
            sampler=Sampler(sampling),
            text=TextAssembler((*sampling.stop, *self._stop)),
            priority=priority,
            order=next(self._order),
            deadline=None if timeout_s is None else now + timeout_s,
            admit_by=now + (timeout_s if timeout_s is not None else self._timeout_s),
            stream=stream,
            reserve=min(len(prompt) + max_tokens, self.sequence_context),
        )
        self._waiting.append(sequence)
        self._waiting.sort(key=lambda s: (s.priority, s.order))
        self._gauges()
        self._wake.set()
        try:
            await asyncio.shield(stream.admitted)
        except asyncio.CancelledError:
            stream.cancelled = True  # the caller left while it waited
            self._wake.set()
            raise
        return stream

    async def run(self, call: Callable[..., T], *args: object) -> T:
        """``call`` on the session's thread (embeddings), between two decode steps."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, call, *args)
        except RuntimeError as exc:
            if not self._closing:
                raise
            raise NotReady(f"model {self.model!r} is unloading", retry_after=1) from exc

    def retry_after(self) -> int:
        """Seconds until a sequence is likely free: the waiting queue's turn, at least 1."""
        turns = (len(self._waiting) + 1) / max(1, self.session.sequences)
        return max(1, math.ceil(turns * self._mean_s))

    # ---- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not (self._closing and not self._running and not self._waiting):
            self._housekeeping(time.monotonic())
            self._admit()
            inputs = self._plan()
            if not inputs:
                if self._frees or self._copies:
                    await loop.run_in_executor(self._executor, self._compute, [])
                self._gauges()
                self._ticked()
                self._wake.clear()
                if self._closing and not self._running and not self._waiting:
                    break
                self._idle = True
                await self._wait_for_work()
                self._idle = False
                continue
            await self._gate.acquire(self._limits, self.device)
            started = time.perf_counter()
            busy: float | None = None
            try:
                events = await loop.run_in_executor(self._executor, self._compute, inputs)
                busy = time.perf_counter() - started
            except Exception as exc:
                self._fail_running(exc)
                continue
            finally:
                await self._gate.release(self.device, busy)
            self._load.record_batch(busy)
            self.steps += 1
            self._deliver(events)
            self._gauges()
            self._ticked()

    def _ticked(self) -> None:
        if self._tick is not None and not self._tick.done():
            self._tick.set_result(None)

    async def iteration(self) -> None:
        """Until the loop ends its next iteration (a step, or the frees before it idles): a
        sequence cancelled now is freed by the end of the second one at the latest. At once
        when the loop is parked with nothing to do (there is no next iteration to wait for)."""
        if self._idle and not self._wake.is_set():
            return
        if self._tick is None or self._tick.done():
            self._tick = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._tick)

    async def _wait_for_work(self) -> None:
        """Sleep until a request, a cancellation or the nearest waiting deadline."""
        nearest = min((s.admit_by for s in self._waiting), default=None)
        timeout = None if nearest is None else max(0.0, nearest - time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _housekeeping(self, now: float) -> None:
        """End what was cancelled, shed or is past its deadline (their KV freed this step)."""
        limits = self._limits()
        shed_from = limits.shed_priority_from
        for sequence in list(self._waiting):
            error: ServingError | None = None
            if sequence.stream.cancelled:
                self._metrics.generations.labels(self.model, "cancelled").inc()
            elif shed_from is not None and sequence.priority >= shed_from:
                error = Throttled(
                    f"model {self.model!r}: shed while waiting ({limits.reason or 'governor'})",
                    limits.retry_after_s,
                )
                self._metrics.generations.labels(self.model, "shed").inc()
            elif now >= sequence.admit_by:
                error = DeadlineExceeded(
                    f"model {self.model!r}: no sequence was free before the request's "
                    f"deadline ({len(self._running)} running, {len(self._waiting)} waiting)"
                )
                self._metrics.generations.labels(self.model, "deadline").inc()
            else:
                continue
            self._waiting.remove(sequence)
            sequence.stream.fail(error or NotReady("cancelled"))
        for sequence in list(self._running.values()):
            if sequence.stream.cancelled:
                self._metrics.generations.labels(self.model, "cancelled").inc()
                self._release(sequence, keep=False)
            elif sequence.deadline is not None and now >= sequence.deadline:
                self._metrics.generations.labels(self.model, "deadline").inc()
                sequence.stream.fail(
                    DeadlineExceeded(
                        f"model {self.model!r}: the request's deadline passed after "
                        f"{len(sequence.generated)} tokens"
                    )
                )
                self._release(sequence, keep=False)

    def _admit(self) -> None:
        """Waiting sequences into free slots, by priority, while the KV budget allows."""
        while self._waiting:
            if not self._free_slots and not self._retained:
                return  # every slot runs a sequence: nothing to look up this step
            sequence = self._waiting[0]
            source = None
            if self._generating is None:
                source = best_source(
                    sequence.prompt,
                    [(s.slot, s.tokens) for s in self._running.values()] + self._retained.items(),
                )
            keep = source[0] if source else None
            used = sum(s.reserve for s in self._running.values()) + self._retained.tokens
            while used + sequence.reserve > self.capacity and self._retained:
                self._drop_retained(self._retained.evict(keep))
                used = sum(s.reserve for s in self._running.values()) + self._retained.tokens
            if used + sequence.reserve > self.capacity:
                return  # waits for a running sequence to end
            if not self._free_slots:
                evicted = self._retained.evict(keep)
                if evicted is None:
                    if keep is None or keep in self._running:
                        return
                    self._retained.pop(keep)  # the only slot left is the cached one
                    evicted, source = keep, None
                self._drop_retained(evicted)
            self._waiting.pop(0)
            sequence.slot = self._free_slots.pop(0)
            if source is not None:
                self._copies.append((source[0], sequence.slot, source[1]))
                sequence.fed = sequence.cached_from = source[1]
                self._retained.touch(source[0])
            sequence.admitted_at = sequence.last_at = time.monotonic()
            self._running[sequence.slot] = sequence
            sequence.stream.admitted.set_result(None)

    def _drop_retained(self, slot: int | None) -> None:
        if slot is not None:
            self._frees.append(slot)
            self._free_slots.append(slot)

    def _plan(self) -> list[tuple[SequenceState, SequenceInput]]:
        """This step's batch: every decode token, then prompt chunks within prefill_chunk."""
        if self._generating is not None:  # the runtime chunks prompts itself
            ordered = sorted(self._running.values(), key=lambda s: (s.priority, s.order))
            return [(s, SequenceInput(s.slot, (), s.fed)) for s in ordered]
        budget = self._settings.prefill_chunk
        inputs = []
        for sequence in sorted(self._running.values(), key=lambda s: (s.priority, s.order)):
            remaining = len(sequence.prompt) - sequence.fed
            if remaining <= 0:
                token = sequence.generated[-1]
                inputs.append((sequence, SequenceInput(sequence.slot, (token,), sequence.fed)))
            elif budget > 0:
                take = min(remaining, budget)
                budget -= take
                chunk = tuple(sequence.prompt[sequence.fed : sequence.fed + take])
                inputs.append((sequence, SequenceInput(sequence.slot, chunk, sequence.fed)))
        return inputs

    # ---- the session's thread ----------------------------------------------------------------

    def _compute(self, inputs: list[tuple[SequenceState, SequenceInput]]) -> list[StepEvent]:
        """Free, share, decode, sample, assemble: everything that touches the session."""
        frees, self._frees = self._frees, []
        copies, self._copies = self._copies, []
        for slot in frees:
            self.session.free(slot)
        for source, target, length in copies:
            self.session.copy_prefix(source, target, length)
        if not inputs:
            self.kv = self.session.kv_bytes()
            return []
        if self._generating is not None:
            events = advance(self._generating, [sequence for sequence, _ in inputs])
            self.kv = self.session.kv_bytes()
            return events
        logits = self.session.step([item for _, item in inputs])
        self.kv = self.session.kv_bytes()  # read here: the loop never waits on the session
        events = []
        for sequence, item in inputs:
            sequence.fed = item.position + len(item.tokens)
            if sequence.fed < len(sequence.prompt):
                continue  # a prompt chunk: no token yet
            token = sequence.sampler(logits[sequence.slot])
            if self.session.is_end(token):
                events.append(StepEvent(sequence, sequence.text.finish(), FINISH_STOP))
                continue
            sequence.generated.append(token)
            sequence.pending_tokens += 1
            text = sequence.text.feed(self.session.piece(token))
            finish = None
            if sequence.text.stopped:
                finish = FINISH_STOP
            elif len(sequence.generated) >= sequence.max_tokens or (
                sequence.fed >= self.sequence_context  # no position left to feed it at
            ):
                finish = FINISH_LENGTH
                text += sequence.text.finish()
            events.append(StepEvent(sequence, text, finish))
        return events

    # ---- back on the loop --------------------------------------------------------------------

    def _deliver(self, events: list[StepEvent]) -> None:
        now = time.monotonic()
        for event in events:
            sequence = event.sequence
            if sequence.stream.ended or self._running.get(sequence.slot) is not sequence:
                continue
            if sequence.first_at is None:
                sequence.first_at = now
                self._metrics.first_token.labels(self.model).observe(now - sequence.admitted_at)
            else:
                self._metrics.inter_token.labels(self.model).observe(now - sequence.last_at)
            sequence.last_at = now
            if event.text:
                sequence.stream.put(TextChunk(event.text, sequence.pending_tokens))
                sequence.pending_tokens = 0
            if event.finish is not None:
                self._finish(sequence, event.finish, now)

    def _finish(self, sequence: SequenceState, reason: str, now: float) -> None:
        first = (sequence.first_at or now) - sequence.admitted_at
        usage = Usage(
            len(sequence.prompt), len(sequence.generated), first, now - sequence.admitted_at
        )
        if sequence.pending_tokens:  # tokens whose text was held back or empty
            sequence.stream.put(TextChunk("", sequence.pending_tokens))
        sequence.stream.end(reason, usage)
        self._metrics.generations.labels(self.model, reason).inc()
        self._metrics.tokens.labels(self.model, "prompt").inc(len(sequence.prompt))
        self._metrics.tokens.labels(self.model, "prompt_cached").inc(sequence.cached_from)
        self._metrics.tokens.labels(self.model, "completion").inc(len(sequence.generated))
        if (
            len(sequence.generated) > 1
            and sequence.first_at is not None
            and now > sequence.first_at
        ):
            rate = (len(sequence.generated) - 1) / (now - sequence.first_at)
            self._metrics.rate.labels(self.model).observe(rate)
        self._mean_s = 0.8 * self._mean_s + 0.2 * usage.total_s
        self._release(sequence, keep=True)

    def _release(self, sequence: SequenceState, *, keep: bool) -> None:
        """A sequence left its slot: kept for its prefix, or freed in the next step."""
        del self._running[sequence.slot]
        if keep and not self._closing and sequence.fed > 0 and self._generating is None:
            self._retained.keep(sequence.slot, sequence.tokens)
        else:
            self._frees.append(sequence.slot)
            self._free_slots.append(sequence.slot)
        if not sequence.stream.ended:
            sequence.stream.end(None, None)

    def _fail_running(self, error: Exception) -> None:
        failure = ServingError(f"model {self.model!r}: generation failed: {error}")
        for sequence in list(self._running.values()):
            self._metrics.generations.labels(self.model, "failed").inc()
            sequence.stream.fail(failure)
            self._release(sequence, keep=False)

    def _gauges(self) -> None:
        active, cached, allocated = self._kv_split()
        self._metrics.kv_bytes.labels(self.model, "used").set(active)
        self._metrics.kv_bytes.labels(self.model, "cached").set(cached)
        self._metrics.kv_bytes.labels(self.model, "allocated").set(allocated)
        self._metrics.sequences.labels(self.model, "running").set(len(self._running))
        self._metrics.sequences.labels(self.model, "waiting").set(len(self._waiting))

    # ---- status and shutdown -------------------------------------------------------------------

    def _kv_split(self) -> tuple[int, int, int]:
        """KV bytes (held by running sequences, kept as prefixes for reuse, allocated): the
        kept ones are given back whenever a sequence needs the room."""
        total, allocated = self.kv
        cached = min(total, self._retained.tokens * self._per_token)
        return total - cached, cached, allocated

    def status(self) -> dict:
        used, cached, allocated = self._kv_split()
        return {
            "device": self.device,
            "sequences": self.session.sequences,
            "running": len(self._running),
            "waiting": len(self._waiting),
            "kv_bytes_used": used,
            "kv_bytes_cached": cached,
            "kv_bytes_allocated": allocated,
            "kv_tokens_budget": self.capacity,
            "context": self.sequence_context,
            "cached_prefixes": len(self._retained),
            "steps": self.steps,
        }

    async def close(self, drain_s: float) -> None:
        """Finish what runs (up to ``drain_s``), refuse the rest, free the session."""
        self._closing = True
        self._wake.set()
        if self._task is not None and not self._task.done():
            done, _ = await asyncio.wait({self._task}, timeout=drain_s)
            if not done:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        unloading = NotReady(f"model {self.model!r} unloaded", retry_after=1)
        for sequence in [*self._waiting, *self._running.values()]:
            sequence.stream.fail(unloading)
        self._waiting.clear()
        self._running.clear()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.session.close)
        self._executor.shutdown(wait=True)
        self._metrics.forget(self.model)
