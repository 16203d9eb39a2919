"""Rollout policies: the only place a rollout rule lives (stages, abort criteria, time-outs, done).

``base`` is the contract both engines drive (``hub rollout`` and the hub server's controller);
each other module is one policy. ``stored_policy`` is where a deployment row becomes its policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgeagent.hub.policy.base import (
    ALREADY_DONE,
    FAILED,
    FAILURES,
    FINISHED,
    SUCCEEDED,
    TIMED_OUT,
    PolicyError,
    RolloutPolicy,
    Tally,
    Verdict,
    classify,
)
from edgeagent.hub.policy.staged import StagedPolicy

__all__ = [
    "ALREADY_DONE",
    "FAILED",
    "FAILURES",
    "FINISHED",
    "SUCCEEDED",
    "TIMED_OUT",
    "PolicyError",
    "RolloutPolicy",
    "StagedPolicy",
    "Tally",
    "Verdict",
    "classify",
    "stored_policy",
]


def stored_policy(row: Mapping[str, Any]) -> RolloutPolicy:
    """The policy a deployment row was created with (every deployment is staged today)."""
    return StagedPolicy.from_fields(row)
