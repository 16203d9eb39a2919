"""A Session that survives its accelerator: demote what fails, continue on the next candidate.

Frigate users' top requests are exactly this: fall back when an accelerator disappears, ordered
failover, and seeing which accelerator is really in use. A run that raises is checked against
the probe input; a session that cannot answer that is broken and demoted at once, otherwise
``failure_threshold`` consecutive errors demote it. The failing request is retried once on the
successor, so only a request the successor also refuses fails. A demoted candidate is re-probed
after an exponential back-off and takes over again when it ranks higher than the active one.
Every load (failover, re-probe, power mode) runs outside the lock: while a successor loads,
status answers and other requests fail fast with the reason instead of waiting for the load.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeagent.hardware.choose import Option
from edgeagent.hardware.probe import Prober, ProbeResult, check_outputs
from edgeagent.hardware.profile import Candidate
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.golden import sample_feeds
from edgeagent.models.package import ModelPackage, TensorSpec
from edgeagent.runtimes import InferenceError, Session, TensorInfo

log = logging.getLogger(__name__)

_HISTORY = 20  # demotions kept for status


@dataclass
class _Lease:
    """The active session and how many runs use it, so a retired one closes only when idle."""

    option: Option
    session: Session
    users: int = 0
    retired: bool = False

    def retire(self) -> None:
        self.retired = True
        if self.users == 0:
            self.session.close()


@dataclass
class _Health:
    """What the session knows about one candidate."""

    errors: int = 0  # consecutive run errors
    demotions: int = 0
    reason: str = ""
    retry_at: float | None = None  # monotonic time of the next re-probe while demoted
    unavailable: bool = False  # failed its first probe: not retried until the cache expires
    probe: ProbeResult | None = None
    timer: threading.Timer | None = field(default=None, repr=False)


def _declared(specs: Sequence[TensorSpec]) -> list[TensorInfo]:
    return [TensorInfo(t.name, t.dtype, t.shape) for t in specs]


class ResilientSession(Session):
    """The runtimes Session contract over an ordered list of candidates for one package."""

    def __init__(
        self,
        package: ModelPackage,
        order: Sequence[Option],
        prober: Prober,
        settings: HardwareSettings,
        *,
        model_hash: str,
        initial: tuple[Option, Session] | None = None,
        results: Mapping[str, ProbeResult] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_demote: Callable[[str, str], None] | None = None,
    ) -> None:
        self.package = package
        self._on_demote = on_demote  # (model name, candidate key): the demotion counter
        self._order = list(order)
        self._prober = prober
        self._settings = settings
        self._hash = model_hash
        self._clock = clock
        self._lock = threading.RLock()
        self._loading = False  # a failover load is in progress (outside the lock)
        self._closed = False
        self._mode = "high"
        self._health = {o.key: _Health(probe=(results or {}).get(o.key)) for o in self._order}
        self._history: list[dict[str, Any]] = []
        self._lease: _Lease | None = None
        self._feeds = sample_feeds(package)
        for key, result in (results or {}).items():
            if key in self._health and not result.ok:
                self._health[key].reason = f"probe failed: {result.error}"
                self._health[key].unavailable = True
        if initial is not None:
            self._lease = _Lease(*initial)
        else:
            self._activate()

    # -- the Session contract -------------------------------------------------------------
    @property
    def runtime(self) -> str:  # type: ignore[override]
        return self.candidate.runtime if self.candidate else ""

    @property
    def device(self) -> str:  # type: ignore[override]
        lease = self._lease
        return lease.session.device if lease else ""

    @property
    def precision(self) -> str:  # type: ignore[override]
        return self.candidate.precision if self.candidate else ""

    @property
    def candidate(self) -> Candidate | None:
        """The active profile Candidate, or None while no candidate works."""
        lease = self._lease
        return lease.option.candidate if lease else None

    @property
    def inputs(self) -> Sequence[TensorInfo]:
        """The active session's view; the package's declaration while none works."""
        lease = self._lease
        return lease.session.inputs if lease else _declared(self.package.inputs)

    @property
    def outputs(self) -> Sequence[TensorInfo]:
        lease = self._lease
        return lease.session.outputs if lease else _declared(self.package.outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        lease = self._acquire()
        for attempt in (1, 2):  # the request in flight gets one retry on the successor
            try:
                outputs = lease.session.run(feeds)
            except Exception as exc:
                try:
                    successor = self._after_error(lease, exc)  # held: not closed under it
                finally:
                    self._release(lease)
                if successor is None:
                    raise
                if attempt == 2:
                    self._release(successor)
                    raise
                lease = successor
                continue
            self._health[lease.option.key].errors = 0
            self._release(lease)
            return outputs
        raise AssertionError("unreachable")  # pragma: no cover

    def fork(self) -> Session:
        """A fresh session on the backend that serves now (runtime state of its own)."""
        lease = self._acquire()
        try:
            return lease.session.fork()
        finally:
            self._release(lease)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for health in self._health.values():
                if health.timer is not None:
                    health.timer.cancel()
            if self._lease is not None:
                self._lease.retire()
                self._lease = None

    # -- power mode -----------------------------------------------------------------------
    def set_power_mode(self, mode: str) -> None:
        """Move to the best working ``low``-power candidate, or back to the best of all.

        The new session loads while the current one keeps serving; only the swap takes the lock.
        """
        if mode not in ("high", "low"):
            raise ValueError(f"power mode must be 'high' or 'low', got {mode!r}")
        with self._lock:
            if mode == self._mode:
                return
            self._mode = mode
            log.info("%s: power mode %s", self.package.name, mode)
            best = next(iter(self._eligible()), None)
            if best is None or (self._lease is not None and best.key == self._lease.option.key):
                return
        session = self._load(best)
        with self._lock:
            if session is not None:
                self._promote(best, session)
            vacant = self._lease is None
        if vacant:
            self._activate()

    # -- status ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            lease = self._lease
            now = self._clock()
            candidates = []
            for option in self._order:
                health = self._health[option.key]
                if lease is not None and option.key == lease.option.key:
                    state = "active"
                elif health.unavailable:
                    state = "unavailable"
                elif health.retry_at is not None:
                    state = "demoted"
                else:
                    state = "standby"
                entry: dict[str, Any] = {
                    "candidate": option.key,
                    "rank": option.rank + 1,
                    "power": option.candidate.power,
                    "state": state,
                    "demotions": health.demotions,
                }
                if health.reason:
                    entry["reason"] = health.reason
                if health.retry_at is not None:
                    entry["reprobe_in_s"] = round(max(0.0, health.retry_at - now), 1)
                if health.probe is not None:
                    entry["probe"] = health.probe.to_dict()
                candidates.append(entry)
            active = None
            if lease is not None:
                candidate = lease.option.candidate
                active = {
                    "candidate": candidate.key,
                    "runtime": candidate.runtime,
                    "device": lease.session.device,
                    "precision": candidate.precision,
                    "power": candidate.power,
                }
            return {
                "model": self.package.name,
                "version": self.package.version,
                "active": active,
                "power_mode": self._mode,
                "candidates": candidates,
                "demotions": list(self._history),
            }

    # -- internals ------------------------------------------------------------------------
    def _eligible(self) -> list[Option]:
        """Candidates not waiting out a demotion, in the order the power mode prefers."""
        usable = [
            o
            for o in self._order
            if self._health[o.key].retry_at is None and not self._health[o.key].unavailable
        ]
        if self._mode == "low":
            return [o for o in usable if o.candidate.power == "low"] + [
                o for o in usable if o.candidate.power != "low"
            ]
        return usable

    def _acquire(self) -> _Lease:
        with self._lock:
            vacant = self._lease is None and not self._closed
        if vacant:
            self._activate()
        with self._lock:
            lease = self._lease
            if lease is None:
                raise InferenceError(self._no_candidate_message())
            lease.users += 1
            return lease

    def _release(self, lease: _Lease) -> None:
        with self._lock:
            lease.users -= 1
            if lease.retired and lease.users == 0:
                lease.session.close()

    def _no_candidate_message(self) -> str:
        reasons = "; ".join(
            f"{key}: {h.reason}" for key, h in self._health.items() if h.reason
        )  # fmt: skip
        if self._loading:
            return f"{self.package.name} is switching accelerators after a failure; retry shortly"
        return f"no working accelerator for {self.package.name} ({reasons or 'none configured'})"

    def _healthy(self, session: Session) -> bool:
        """Whether the session still answers the probe input correctly."""
        try:
            return not check_outputs(self.package, session.run(self._feeds))
        except Exception:
            return False

    def _after_error(self, lease: _Lease, exc: Exception) -> _Lease | None:
        """Count the error; demote when the session is broken. Returns a successor lease.

        The probe run and the successor's load happen outside the lock, so requests, status
        and power-mode calls never wait for a failover: meanwhile they fail fast.
        """
        key = lease.option.key
        with self._lock:
            health = self._health[key]
            health.errors += 1
            errors = health.errors
            replaced = self._lease is not lease  # someone already replaced it
        if replaced:
            reason = ""
        elif errors >= self._settings.failure_threshold:
            reason = f"{errors} consecutive run errors, last: {exc}"
        elif not self._healthy(lease.session):
            reason = f"run failed and the probe input fails too: {exc}"
        else:
            log.warning("%s on %s: run error %d: %s", self.package.name, key, errors, exc)
            return None
        claimed = None
        if reason:
            with self._lock:  # demote and claim the load at once: no gap without either
                if self._lease is lease:
                    self._demote_locked(key, reason)
                claimed = self._claim_load_locked()
        if claimed is not None:
            self._load_best(claimed)
        with self._lock:
            successor = self._lease
            if successor is None and self._loading:  # another request's failover is under way
                raise InferenceError(self._no_candidate_message()) from exc
            if successor is None:
                return None
            successor.users += 1
            return successor

    def _demote_locked(self, key: str, reason: str, *, load_failure: bool = False) -> None:
        health = self._health[key]
        health.demotions += 1
        if self._on_demote is not None:
            self._on_demote(self.package.name, key)
        health.errors = 0
        health.reason = reason
        backoff = min(
            self._settings.reprobe_backoff_s * 2 ** (health.demotions - 1),
            self._settings.reprobe_backoff_max_s,
        )
        health.retry_at = self._clock() + backoff
        event = {
            "candidate": key,
            "reason": reason,
            "at": round(time.time(), 3),
            "reprobe_after_s": backoff,
        }
        self._history = [*self._history, event][-_HISTORY:]
        if not load_failure:
            log.warning("%s: demoted %s (%s); re-probe in %g s", self.package.name, key, reason,
                        backoff)  # fmt: skip
        if self._lease is not None and self._lease.option.key == key:
            self._lease.retire()
            self._lease = None
        self._schedule(key, backoff)

    def _schedule(self, key: str, delay: float) -> None:
        health = self._health[key]
        if health.timer is not None:
            health.timer.cancel()
        if self._closed:
            return
        timer = threading.Timer(delay, self._reprobe, args=(key,))
        timer.daemon = True
        timer.name = f"reprobe-{self.package.name}-{key}"
        health.timer = timer
        timer.start()

    def _load(self, option: Option, *, use_cache: bool = True) -> Session | None:
        """Load and prove one candidate; never called with the lock held (a load can be slow)."""
        assert option.variant is not None
        session, result = self._prober.load(
            self.package,
            option.candidate,
            option.variant,
            model_hash=self._hash,
            use_cache=use_cache,
        )
        with self._lock:
            health = self._health[option.key]
            health.probe = result
            if session is None and result.cached:  # a known failure on this device: not retried
                health.unavailable = True
                health.reason = f"probe failed: {result.error}"
            elif session is None:
                self._demote_locked(option.key, f"load failed: {result.error}", load_failure=True)
        return session

    def _promote(self, option: Option, session: Session) -> bool:
        """Swap ``session`` in when ``option`` is now the best eligible candidate, else close it."""
        eligible = self._eligible()
        if self._closed or not eligible or eligible[0].key != option.key:
            session.close()
            return False
        previous = self._lease
        self._lease = _Lease(option, session)
        if previous is not None:
            previous.retire()
        log.warning("%s now runs on %s", self.package.name, option.key)
        return True

    def _activate(self) -> None:
        """With nothing to serve with: load the best eligible candidate, outside the lock."""
        with self._lock:
            claimed = self._claim_load_locked()
        if claimed is not None:
            self._load_best(claimed)

    def _claim_load_locked(self) -> list[Option] | None:
        """Become the one loader when nothing serves; None when a load is already under way.

        A caller that finds one under way fails fast (``_acquire``) rather than queueing behind
        a load that can take minutes.
        """
        if self._loading or self._closed or self._lease is not None:
            return None
        self._loading = True
        return self._eligible()

    def _load_best(self, eligible: list[Option]) -> None:
        """The claimed load: the first of ``eligible`` that loads and is still the best."""
        try:
            for option in eligible:
                session = self._load(option)
                if session is None:
                    continue
                with self._lock:
                    if self._closed or self._lease is not None:  # a re-probe filled the gap
                        session.close()
                        return
                    if self._promote(option, session):
                        return
        finally:
            with self._lock:
                self._loading = False

    def _reprobe(self, key: str) -> None:
        """Timer callback: try a demoted candidate again, outside the lock so serving goes on."""
        with self._lock:
            if self._closed:
                return
            option = next(o for o in self._order if o.key == key)
            self._health[key].timer = None
        session = self._load(option, use_cache=False)  # a failure demotes it again, longer
        if session is None:
            return
        with self._lock:
            health = self._health[key]
            health.retry_at = None
            health.reason = ""
            log.warning("%s: %s works again", self.package.name, key)
            self._promote(option, session)  # a standby when it ranks below the active one
