"""The staged policy (AWS IoT Jobs' terms): growing cumulative stages and a failure-share abort.

The release goes to a growing share of the devices — by default 5 % → 25 % → 100 %, each stage
cumulative and at least one device. A stage waits for every one of its devices to answer, or
for its in-progress time-out (``stage_timeout_s``); a silent device counts as timed out. Then
the abort criterion: once at least ``min_executed`` devices finished, if the failed share
(failed, refused for any reason but "already at this version", timed out) of every finished
device so far reaches ``abort_threshold_pct``, the rollout aborts and no further device gets
the release. Otherwise the next stage starts; after the last one the rollout succeeded, whatever
share below the threshold failed (devices that fail roll themselves back).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from edgeagent.hub.policy.base import (
    PolicyError,
    RolloutPolicy,
    Tally,
    Verdict,
    integer,
    number,
    shown,
)

MAX_MIN_EXECUTED = 1_000_000_000  # fits the database column; no fleet is larger
MAX_STAGES = 100  # a rollout of more stages is a typo, and each is a row in every answer
STAGES_EXAMPLE = "e.g. [5, 25, 100]"


@dataclass(frozen=True)
class StagedPolicy(RolloutPolicy):
    name: ClassVar[str] = "staged"

    stages_pct: tuple[float, ...] = (5.0, 25.0, 100.0)
    abort_threshold_pct: float = 20.0  # failed share of finished devices that stops the rollout
    min_executed: int = 1  # finished devices needed before the abort criterion applies
    stage_timeout_s: float = 600.0  # in-progress time-out per stage

    def __post_init__(self) -> None:
        """Refuse what cannot be run, so a policy that exists is one the engines can follow."""
        fields = self.fields()
        number(fields, "abort_threshold_pct", 0, 0, 100)
        integer(fields, "min_executed", 0, 1, MAX_MIN_EXECUTED)
        number(fields, "stage_timeout_s", 0, 0, math.inf)
        stages = self.stages_pct
        if len(stages) > MAX_STAGES:
            raise PolicyError("stages_pct", f"must have at most {MAX_STAGES} stages")
        if not stages or any(not 0 < p <= 100 for p in stages) or list(stages) != sorted(stages):
            raise PolicyError(
                "stages_pct",
                f"must be increasing percentages in (0, 100], {STAGES_EXAMPLE}, "
                f"got {shown(list(stages))}",
            )
        if stages[-1] != 100:
            raise PolicyError(
                "stages_pct", f"the last stage must be 100 (every device), {STAGES_EXAMPLE}"
            )

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, Any], *, max_stage_timeout_s: float | None = None
    ) -> StagedPolicy:
        """Strictly typed: each stage a finite number, ``min_executed`` an integer.

        Without ``stage_timeout_s`` a stage waits the default or the server's cap, whichever
        is shorter, so a server started with a short ``--max-wait`` still takes a plain body.
        """
        defaults = cls()
        cap = math.inf if max_stage_timeout_s is None else max_stage_timeout_s
        stages = fields.get("stages_pct", defaults.stages_pct)
        if not isinstance(stages, Sequence) or isinstance(stages, (str, bytes)):
            raise PolicyError("stages_pct", f"must be a list of percentages, got {shown(stages)}")
        indexed = {f"stages_pct[{i}]": p for i, p in enumerate(stages)}
        return cls(
            stages_pct=tuple(number(indexed, key, 0, 0, 100) for key in indexed),
            abort_threshold_pct=number(
                fields, "abort_threshold_pct", defaults.abort_threshold_pct, 0, 100
            ),
            min_executed=integer(
                fields, "min_executed", defaults.min_executed, 1, MAX_MIN_EXECUTED
            ),
            stage_timeout_s=number(
                fields, "stage_timeout_s", min(defaults.stage_timeout_s, cap), 0, cap
            ),
        )

    def fields(self) -> dict[str, Any]:
        return {
            "stages_pct": list(self.stages_pct),
            "abort_threshold_pct": self.abort_threshold_pct,
            "min_executed": self.min_executed,
            "stage_timeout_s": self.stage_timeout_s,
        }

    def stage_sizes(self, total: int) -> list[int]:
        """At least one device a stage, never more than the fleet; equal sizes merge."""
        sizes: list[int] = []
        for pct in self.stages_pct:
            size = min(total, max(1, math.ceil(total * pct / 100)))
            if not sizes or size > sizes[-1]:
                sizes.append(size)
        return sizes

    def deadline(self, stage_started_at: float) -> float:
        return stage_started_at + self.stage_timeout_s

    def verdict(self, stage: int, stage_count: int, tally: Tally) -> Verdict:
        threshold = self.abort_threshold_pct
        if tally.finished >= self.min_executed and tally.failed_pct >= threshold:
            return Verdict(
                "aborted",
                f"stage {stage}: {tally.failed} of {tally.finished} devices failed "
                f"({tally.failed_pct:.0f} % ≥ abort threshold {threshold:g} %)",
            )
        return Verdict("succeeded" if stage >= stage_count else "next")
