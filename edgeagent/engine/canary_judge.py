"""The canary: a new version beside the stable one, judged on live traffic, awaitable verdict.

A canary takes ``share`` of the unversioned lookups. After each of its requests it is judged
against the stable version over the same window (requests since the canary started):

- rolled back as soon as its server faults are more than ``max_error_rate`` of
  ``min_requests`` (more requests could not bring the rate back under the limit), so a broken
  version fails as few clients as possible;
- once it has ``min_requests`` requests: rolled back when its error rate is over the limit or
  its p99 latency is more than ``max_p99_ratio`` × the stable version's p99; else promoted.

p99, not the mean: a version that is fast on most inputs and stalls on a few is what users
notice, and a mean hides it. With too little traffic by ``max_seconds``, what it saw is still
checked (a failing or slow canary is rolled back) and ``without_traffic`` decides the rest:
``promote`` (the golden check, which it passed before taking traffic, vouches for it) or
``rollback``. The registry owns routing and retiring; this module owns the judgement.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from edgeagent.engine.serving import LoadedModel
from edgeagent.engine.settings import EngineSettings

PROMOTED = "promoted"
ROLLED_BACK = "rolled_back"
INTERRUPTED = "interrupted"  # unloaded, replaced or superseded before a verdict

WithoutTraffic = Literal["promote", "rollback"]


@dataclass(frozen=True)
class CanaryPolicy:
    """Everything one canary is judged by (see the module docstring).

    The bounds of what a release may ask are the fleet's policy (``fleet.release_canary.LIMITS``,
    checked when the manifest is parsed); the engine only judges by the numbers it is given.
    """

    share: float = 0.1
    min_requests: int = 50
    max_error_rate: float = 0.02
    max_p99_ratio: float = 1.5
    max_seconds: float = 600.0
    without_traffic: WithoutTraffic = "promote"

    def __post_init__(self) -> None:
        if self.without_traffic not in ("promote", "rollback"):
            raise ValueError(
                f"canary without_traffic: {self.without_traffic!r} is not 'promote' or 'rollback'"
            )

    @classmethod
    def from_settings(cls, settings: EngineSettings, **overrides: Any) -> CanaryPolicy:
        """The ``[server] canary_*`` defaults, with ``overrides`` (a release's own values)."""
        base = cls(
            min_requests=settings.canary_min_requests,
            max_error_rate=settings.canary_max_error_rate,
            max_p99_ratio=settings.canary_max_p99_ratio,
        )
        return dataclasses.replace(base, **overrides)


@dataclass(frozen=True)
class CanaryVerdict:
    """How a canary ended, with the figures it was judged on (both sides, same window)."""

    outcome: str  # PROMOTED, ROLLED_BACK or INTERRUPTED
    reason: str
    decided_by: str  # "traffic", "max_seconds" or "interrupted"
    canary_requests: int  # answered + server faults
    canary_faults: int
    stable_requests: int  # answered by the stable version during the window
    error_rate: float | None
    canary_p99_ms: float | None
    stable_p99_ms: float | None
    p99_ratio: float | None
    elapsed_s: float

    def figures(self) -> dict[str, Any]:
        """The verdict as JSON-ready numbers (what the update outcome reports)."""
        return {
            key: round(value, 4) if isinstance(value, float) else value
            for key, value in dataclasses.asdict(self).items()
        }

    def summary(self) -> str:
        """One line for a report: counts, error rate and p99s."""
        rate = "-" if self.error_rate is None else f"{self.error_rate:.2%}"
        ratio = "-" if self.p99_ratio is None else f"{self.p99_ratio:.2f}"
        return (
            f"canary {self.canary_requests} requests ({self.canary_faults} failed, {rate}), "
            f"stable {self.stable_requests}; p99 {_ms(self.canary_p99_ms)} vs "
            f"{_ms(self.stable_p99_ms)} (ratio {ratio}) after {self.elapsed_s:.1f} s"
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _p99(samples: np.ndarray) -> float | None:
    return float(np.percentile(samples, 99)) / 1e6 if samples.size else None


class Canary:
    """One running canary: its traffic share, the window it is judged over, its verdict.

    The registry creates it and awaits nothing; whoever asked for the canary awaits
    ``outcome()``, which always resolves (a verdict, a time-out, or an interruption).
    """

    def __init__(self, model: LoadedModel, stable: LoadedModel, policy: CanaryPolicy) -> None:
        self.model = model
        self.policy = policy
        self.routed = 0  # unversioned lookups seen since the start
        self.started = time.monotonic()
        self._stable_start = stable.stats.health()
        self._stable_mark = stable.stats.latency_mark()
        self._own_start = model.stats.health()  # after its golden check: that is not traffic
        self._own_mark = model.stats.latency_mark()
        self._future: asyncio.Future[CanaryVerdict] = asyncio.get_running_loop().create_future()
        self.timer: asyncio.TimerHandle | None = None

    def outcome(self) -> asyncio.Future[CanaryVerdict]:
        """Resolves once, with the verdict; the registry has acted on it by then."""
        return self._future

    @property
    def done(self) -> bool:
        return self._future.done()

    def takes_next(self) -> bool:
        """Exactly ``share`` of the lookups, spread evenly (every 10th for 0.1); none once
        the canary has its verdict (it may still be loaded until the registry retires it)."""
        if self.done:
            return False
        self.routed += 1
        share = self.policy.share
        return int(self.routed * share) > int((self.routed - 1) * share)

    def counts(self) -> tuple[int, int]:
        """(requests, server faults) of the canary since it started."""
        answered, _, faults = self.model.stats.health()
        answered -= self._own_start[0]
        faults -= self._own_start[2]
        return answered + faults, faults

    def judge(self, stable: LoadedModel) -> CanaryVerdict | None:
        """After each canary request: the verdict, or None while the evidence is too thin.

        An ended canary (``end``) answers its interruption, so it is retired, never promoted.
        """
        if self.done:
            return self._future.result()
        requests, faults = self.counts()
        if faults > self.policy.max_error_rate * self.policy.min_requests:
            return self._verdict(stable, "traffic")
        if requests < self.policy.min_requests:
            return None
        return self._verdict(stable, "traffic")

    def time_out(self, stable: LoadedModel) -> CanaryVerdict:
        """``max_seconds`` passed without a verdict: judge what was seen, then
        ``without_traffic`` decides; an ended canary answers its interruption."""
        if self.done:
            return self._future.result()
        return self._verdict(stable, "max_seconds")

    def interrupted(self, why: str) -> CanaryVerdict:
        return self._figures(None, INTERRUPTED, why, "interrupted")

    def end(self, why: str) -> None:
        """Conclude now without a verdict (a newer release of the model came): from here it
        takes no traffic and can never be promoted, and whoever awaits ``outcome()`` goes on.

        Its judge is then asked to look at once — the hooks run after each of its requests,
        which is how the registry judges a canary — so the registry retires the version now
        rather than at its time-out (its ``judge`` and ``time_out`` answer the interruption).
        """
        if self._future.done():
            return
        self._future.set_result(self.interrupted(why))
        for look in list(self.model.on_request_done):
            look()

    def resolve(self, verdict: CanaryVerdict) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if not self._future.done():
            self._future.set_result(verdict)

    def _verdict(self, stable: LoadedModel, decided_by: str) -> CanaryVerdict:
        policy = self.policy
        probe = self._figures(stable, PROMOTED, "", decided_by)
        if probe.error_rate is not None and probe.error_rate > policy.max_error_rate:
            why = (
                f"{probe.canary_faults} of {probe.canary_requests} requests failed "
                f"({probe.error_rate:.1%} > max_error_rate {policy.max_error_rate:.1%})"
            )
            if probe.canary_requests < policy.min_requests:
                why += f"; more than {policy.max_error_rate:.1%} of {policy.min_requests}"
            return dataclasses.replace(probe, outcome=ROLLED_BACK, reason=why)
        if probe.p99_ratio is not None and probe.p99_ratio > policy.max_p99_ratio:
            why = (
                f"p99 latency {_ms(probe.canary_p99_ms)} against {_ms(probe.stable_p99_ms)} "
                f"of version {stable.version} (ratio {probe.p99_ratio:.2f} > max_p99_ratio "
                f"{policy.max_p99_ratio:g})"
            )
            return dataclasses.replace(probe, outcome=ROLLED_BACK, reason=why)
        if decided_by == "traffic":
            return dataclasses.replace(probe, reason="within every threshold")
        why = (
            f"{probe.canary_requests} of {policy.min_requests} requests in "
            f"{policy.max_seconds:g} s; without_traffic = {policy.without_traffic}"
        )
        outcome = PROMOTED if policy.without_traffic == "promote" else ROLLED_BACK
        return dataclasses.replace(probe, outcome=outcome, reason=why)

    def _figures(
        self, stable: LoadedModel | None, outcome: str, reason: str, decided_by: str
    ) -> CanaryVerdict:
        requests, faults = self.counts()
        stable_requests = 0
        stable_p99 = None
        if stable is not None:
            stable_requests = stable.stats.health()[0] - self._stable_start[0]
            stable_p99 = _p99(stable.stats.latencies_since(self._stable_mark))
        own_p99 = _p99(self.model.stats.latencies_since(self._own_mark))
        ratio = own_p99 / stable_p99 if own_p99 is not None and stable_p99 else None
        return CanaryVerdict(
            outcome=outcome,
            reason=reason,
            decided_by=decided_by,
            canary_requests=requests,
            canary_faults=faults,
            stable_requests=stable_requests,
            error_rate=faults / requests if requests else None,
            canary_p99_ms=own_p99,
            stable_p99_ms=stable_p99,
            p99_ratio=ratio,
            elapsed_s=time.monotonic() - self.started,
        )
