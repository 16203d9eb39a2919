"""Stateful models served per sequence: each client stream keeps a state of its own.

A streaming model answers each window from what it saw before; shared by two clients, their
windows interleave in one state and each stream's answers go wrong (a wake word missed). The
agent does what Triton's sequence batcher does: a request names its stream with the protocol
parameters ``sequence_id`` (an integer or a string), ``sequence_start`` (true on the stream's
first request: a fresh state) and ``sequence_end`` (true on its last: the state is dropped),
and the state travels from one request of a sequence to the next inside the agent:

- state as tensors (``[sequence] state = "tensors"``): the outputs the model returns as its
  next state are kept per sequence and fed back as its state inputs on the next request (zeros
  on the first), through the model's batcher like any request;
- state inside the runtime (``state = "variables"``, TFLite resource variables): each live
  sequence runs on a session of its own, opened on ``sequence_start`` (``Session.fork``) and
  closed on ``sequence_end`` or eviction.

Bounded like every other resource: at most ``[server] max_sequences`` live sequences per model
version (a start beyond it is refused with 429), and a sequence idle for
``sequence_idle_timeout_s`` is evicted when the next request of that model arrives. Requests of
one sequence run one at a time, in arrival order, so its state advances as the client sent it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeagent.engine.errors import InvalidInput, QueueFull
from edgeagent.models.package import ModelPackage
from edgeagent.models.sequence_table import SequenceSpec
from edgeagent.runtimes.base import Session

MAX_ID_LENGTH = 128  # a string sequence_id's characters

Feeds = Mapping[str, np.ndarray]
Run = Callable[[Feeds], Awaitable[dict[str, np.ndarray]]]
# Opens a fresh session of the model (state inside the runtime: one per live sequence).
Fork = Callable[[], Awaitable[Session]]
# Runs one request on a sequence's own session, through the engine's device gate.
RunOn = Callable[[Session, Feeds], Awaitable[dict[str, np.ndarray]]]
Close = Callable[[Session], Awaitable[None]]


@dataclass(frozen=True)
class SequenceControl:
    """A request's place in its stream (Triton's sequence parameters)."""

    id: int | str
    start: bool = False
    end: bool = False


def sequence_control(parameters: Mapping[str, Any]) -> SequenceControl | None:
    """The request's sequence parameters; None when it names no sequence (id absent or 0)."""
    start = _flag(parameters, "sequence_start")
    end = _flag(parameters, "sequence_end")
    raw = parameters.get("sequence_id")
    if raw is None or (isinstance(raw, int) and not isinstance(raw, bool) and raw == 0):
        if start or end:
            raise InvalidInput("parameters.sequence_start/sequence_end need a sequence_id")
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise InvalidInput(
            f"parameters.sequence_id must be a positive integer or a string, got {raw!r}"
        )
    if isinstance(raw, int) and not 0 < raw < 2**64:
        raise InvalidInput(f"parameters.sequence_id must be a positive integer, got {raw}")
    if isinstance(raw, str) and not 0 < len(raw) <= MAX_ID_LENGTH:
        raise InvalidInput(
            f"parameters.sequence_id must be a string of 1 to {MAX_ID_LENGTH} characters"
        )
    return SequenceControl(raw, start, end)


def _flag(parameters: Mapping[str, Any], key: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"parameters.{key} must be true or false, got {value!r}")
    return value


@dataclass
class _Live:
    """One live sequence: its state (tensors) or its own session (variables)."""

    last_used: float
    state: dict[str, np.ndarray] | None = None
    session: Session | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0  # requests holding or awaiting the lock: never evicted under them
    ended: bool = False


class SequenceStore:
    """The live sequences of one stateful model version (see the module docstring)."""

    def __init__(
        self,
        package: ModelPackage,
        spec: SequenceSpec,
        *,
        max_sequences: int,
        idle_timeout_s: float,
        fork: Fork | None = None,
        run_on: RunOn | None = None,
        close_session: Close | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if spec.state == "variables" and (fork is None or run_on is None):
            raise ValueError("state inside the runtime needs fork and run_on")
        self.package = package
        self.spec = spec
        self.max_sequences = max_sequences
        self.idle_timeout_s = idle_timeout_s
        self._fork, self._run_on, self._close_session = fork, run_on, close_session
        self._clock = clock
        self._live: dict[int | str, _Live] = {}
        self.evicted = 0  # idle sequences dropped so far (status, tests)

    @property
    def live(self) -> int:
        return len(self._live)

    def hidden_outputs(self) -> frozenset[str]:
        """Outputs a sequence's client does not see unless it asks: its state, kept here."""
        return frozenset(self.spec.state_outputs)

    async def infer(
        self, control: SequenceControl | None, feeds: Feeds, run: Run
    ) -> dict[str, np.ndarray]:
        """Answer one request of a stateful model; ``run`` is the model's shared path."""
        if control is None:
            return await self._without_sequence(feeds, run)
        given = sorted(set(self.spec.state_inputs) & set(feeds))
        if given:
            raise InvalidInput(
                f"model {self.package.name!r} keeps the state of sequence {control.id!r} "
                f"itself: leave out input(s) {', '.join(given)}"
            )
        await self._evict_idle()
        live = await self._enter(control)  # counted in live.waiting, its lock held
        try:
            if live.ended:  # restarted or evicted while this request waited its turn
                raise InvalidInput(self._not_live(control))
            answer = await self._step(live, feeds, run)
            live.last_used = self._clock()
            if control.end:
                await self._drop(control.id, live)
            return answer
        finally:
            live.lock.release()
            live.waiting -= 1
            if live.ended and live.waiting == 0:
                await self._release(live)

    async def close(self) -> None:
        """Drop every live sequence (the version stops serving)."""
        for key, live in list(self._live.items()):
            await self._drop(key, live)

    # -- internals ------------------------------------------------------------------------------

    async def _without_sequence(self, feeds: Feeds, run: Run) -> dict[str, np.ndarray]:
        """A request outside any sequence: served only where it carries the state itself."""
        name = self.package.name
        how = (
            "send parameters.sequence_id (with sequence_start: true on a stream's first request "
            "and sequence_end: true on its last) so that the agent keeps each stream's state"
        )
        if self.spec.state == "variables":
            raise InvalidInput(
                f"model {name!r} keeps state between requests inside the runtime (resource "
                f"variables), so it cannot be shared by clients without sequences: {how}"
            )
        missing = [n for n in self.spec.state_inputs if n not in feeds]
        if missing:
            raise InvalidInput(
                f"model {name!r} is stateful (state input(s) {', '.join(missing)}): {how}, or "
                "send the state input(s) yourself"
            )
        return await run(feeds)

    async def _enter(self, control: SequenceControl) -> _Live:
        """The request's sequence, its lock acquired (in arrival order) and the request counted
        in ``waiting``; a start holds the fresh sequence's lock before anyone can see it, so a
        next request never runs before the first one's session has opened."""
        live = self._live.get(control.id)
        if not control.start:
            if live is None:
                raise InvalidInput(self._not_live(control))
            live.waiting += 1
            try:
                await live.lock.acquire()
            except BaseException:
                live.waiting -= 1
                raise
            return live
        if live is not None:  # a start on a live id begins the stream again
            await self._drop(control.id, live)
        if len(self._live) >= self.max_sequences:
            raise QueueFull(
                f"model {self.package.name!r} has {len(self._live)} live sequences "
                f"([server] max_sequences = {self.max_sequences}): end one with sequence_end, "
                f"or wait for idle ones to be evicted after sequence_idle_timeout_s = "
                f"{self.idle_timeout_s:g}",
                retry_after=max(1, round(self.idle_timeout_s)),
            )
        fresh = _Live(self._clock(), waiting=1)
        await fresh.lock.acquire()  # free: nobody else knows this sequence yet
        self._live[control.id] = fresh  # claimed before the fork: the bound holds meanwhile
        if self.spec.state == "variables":
            assert self._fork is not None
            try:
                fresh.session = await self._fork()
            except BaseException:
                if self._live.get(control.id) is fresh:
                    del self._live[control.id]
                fresh.lock.release()
                fresh.waiting -= 1
                raise
        return fresh

    def _not_live(self, control: SequenceControl) -> str:
        return (
            f"sequence {control.id!r} of model {self.package.name!r} is not live: a stream's "
            "first request must set parameters.sequence_start: true (a sequence ends with "
            f"sequence_end, and one idle for {self.idle_timeout_s:g} s is evicted)"
        )

    async def _step(self, live: _Live, feeds: Feeds, run: Run) -> dict[str, np.ndarray]:
        if self.spec.state == "variables":
            assert self._run_on is not None and live.session is not None
            return await self._run_on(live.session, feeds)
        state = live.state if live.state is not None else self._initial(feeds)
        answer = await run({**feeds, **state})
        live.state = {i: np.asarray(answer[o]) for i, o in self.spec.pairs}
        return answer

    def _initial(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Zeros in each state input's shape: an open first dimension takes the request's
        rows, any other open dimension (a cache that grows) starts empty."""
        rows = next((len(v) for v in feeds.values() if np.ndim(v)), 1)
        specs = {t.name: t for t in self.package.inputs}
        state = {}
        for name in self.spec.state_inputs:
            spec = specs[name]
            shape = [
                (rows if axis == 0 else 0) if d < 0 else d for axis, d in enumerate(spec.shape)
            ]
            state[name] = np.zeros(shape, dtype=spec.dtype)
        return state

    async def _evict_idle(self) -> None:
        cutoff = self._clock() - self.idle_timeout_s
        for key, live in list(self._live.items()):
            if live.waiting == 0 and live.last_used < cutoff:
                self.evicted += 1
                await self._drop(key, live)

    async def _drop(self, key: int | str, live: _Live) -> None:
        """End a sequence; its session closes once no request of it runs or waits."""
        if self._live.get(key) is live:
            del self._live[key]
        live.ended = True
        if live.waiting == 0:
            await self._release(live)

    async def _release(self, live: _Live) -> None:
        session, live.session, live.state = live.session, None, None
        if session is not None and self._close_session is not None:
            await self._close_session(session)
