"""What every rollout policy is: the contract both rollout engines drive, and the shared vocabulary.

There are two engines — ``hub rollout`` in the foreground over MQTT (``hub/rollout.py``) and the
hub server's durable controller over database rows (``hub/server/controller.py``) — and they
differ only in where devices and answers live. Every *rule* is asked of a ``RolloutPolicy``:
how many devices each stage reaches, when a stage's wait is over (its in-progress time-out or
every device answered), and, once it is, whether the rollout aborts, moves on or is done. So a
new policy is one subclass in one file of this package, and neither engine changes.

What a device's answer means (``classify``) is shared by every policy: the hub's ingest records
it before it knows which deployment's policy will count it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from edgeagent.fleet import outcomes
from edgeagent.fleet.messages import Outcome
from edgeagent.fleet.wire import integer_in, number_of
from edgeagent.hub.keys import HubError

SUCCEEDED, FAILED, TIMED_OUT = "succeeded", "failed", "timed_out"
FINISHED = (SUCCEEDED, FAILED, TIMED_OUT)  # a device's terminal statuses in a rollout
FAILURES = (FAILED, TIMED_OUT)  # what the abort criteria count against the rollout
ALREADY_DONE = {outcomes.SAME_VERSION}  # a refusal that means the device already has the release


class PolicyError(HubError):
    """A policy parameter that cannot be used; ``field`` names it as the REST API spells it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def classify(outcome: Outcome) -> str:
    """A device's install outcome as a rollout's: ``succeeded`` or ``failed``."""
    if outcome.result == "refused" and outcome.code in ALREADY_DONE:
        return SUCCEEDED
    return SUCCEEDED if outcome.result == SUCCEEDED else FAILED


@dataclass(frozen=True)
class Tally:
    """The finished devices of every stage so far: all the abort criteria look at."""

    finished: int = 0
    failed: int = 0

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> Tally:
        """From device counts by status (statuses that are not final are ignored)."""
        return cls(
            finished=sum(counts.get(s, 0) for s in FINISHED),
            failed=sum(counts.get(s, 0) for s in FAILURES),
        )

    @property
    def failed_pct(self) -> float:
        return 100.0 * self.failed / self.finished if self.finished else 0.0


@dataclass(frozen=True)
class Verdict:
    """What follows a finished stage: the next stage, or the deployment's final state."""

    state: Literal["next", "succeeded", "aborted"]
    reason: str = ""


class RolloutPolicy(ABC):
    """The rules of one kind of rollout; instances are immutable and valid once built."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_fields(
        cls, fields: Mapping[str, Any], *, max_stage_timeout_s: float | None = None
    ) -> RolloutPolicy:
        """Build from JSON-like fields (a REST body, a deployment row); absent ones default.

        Fields the policy does not know are ignored (the same body names the targets); a
        wrong type or value raises ``PolicyError`` naming the field. ``max_stage_timeout_s``
        is the server's cap on a stage's wait (``hub server --max-wait``).
        """

    @abstractmethod
    def fields(self) -> dict[str, Any]:
        """The parameters as JSON values: what a deployment row stores and the API shows."""

    @abstractmethod
    def stage_sizes(self, total: int) -> list[int]:
        """Cumulative device counts, one per stage, strictly increasing, the last ``total``."""

    @abstractmethod
    def deadline(self, stage_started_at: float) -> float:
        """When a stage that started at ``stage_started_at`` stops waiting for answers."""

    @abstractmethod
    def verdict(self, stage: int, stage_count: int, tally: Tally) -> Verdict:
        """After stage ``stage`` (1-based) of ``stage_count`` finished, with ``tally`` so far."""

    def stage_over(self, waiting: int, stage_started_at: float, now: float) -> bool:
        """A stage is over when no device is left to answer or its time-out passed; the
        silent devices then count as ``timed_out``."""
        return not waiting or now >= self.deadline(stage_started_at)


def number(fields: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    """A finite JSON number in (``low``, ``high``]; booleans are not numbers here."""
    value = fields.get(key, default)
    result = number_of(value)
    if result is None:
        raise PolicyError(key, f"must be a number, got {shown(value)}")
    if not math.isfinite(result) or not low < result <= high:
        raise PolicyError(key, f"must be in ({low:g}, {high:g}], got {shown(value)}")
    return result


def integer(fields: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    """A JSON integer in [``low``, ``high``]: ``2.7`` and ``true`` are refused, not truncated."""
    value = fields.get(key, default)
    result = integer_in(value)
    if result is None:
        raise PolicyError(key, f"must be an integer, got {shown(value)}")
    if not low <= result <= high:
        raise PolicyError(key, f"must be in [{low}, {high}], got {shown(value)}")
    return result


def shown(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit for str()
        return "an integer of over 4300 digits"
    return text if len(text) <= 40 else text[:37] + "..."
