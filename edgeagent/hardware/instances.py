"""Several execution instances of one variant behind the one Session contract.

An instance is an independent session with its own intra-op threads (``plan_search``): two
single-threaded instances of MobileNetV2 on two cores beat one two-threaded one by 1.49×
(issue 28), because while one instance finishes a batch the other already runs the next. The
batcher runs up to ``instances`` batches at once (``BatchPolicy.instances``); ``run`` hands each
to an idle instance, so no instance is ever entered by two threads. Each instance is a
``ResilientSession`` of its own, so one that faults fails over without stopping the others.
"""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgeagent.hardware.plan_search import MeasuredPlan
from edgeagent.runtimes.base import Backend, ManagedSession, Session, TensorInfo


class InstanceGroup(Session):
    """``instances`` sessions of one variant; ``run`` takes whichever is idle."""

    def __init__(self, sessions: Sequence[Session], plan: MeasuredPlan) -> None:
        if not sessions:
            raise ValueError("an instance group needs at least one session")
        self.sessions = list(sessions)
        self.plan = plan
        self._idle: queue.SimpleQueue[Session] = queue.SimpleQueue()
        for session in self.sessions:
            self._idle.put(session)

    @property
    def instances(self) -> int:
        return len(self.sessions)

    @property
    def first(self) -> Session:
        return self.sessions[0]

    @property
    def runtime(self) -> str:  # type: ignore[override]
        return self.first.runtime

    @property
    def device(self) -> str:  # type: ignore[override]
        return self.first.device

    @property
    def precision(self) -> str:  # type: ignore[override]
        return self.first.precision

    @property
    def inputs(self) -> Sequence[TensorInfo]:
        return self.first.inputs

    @property
    def outputs(self) -> Sequence[TensorInfo]:
        return self.first.outputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on an idle instance; blocks only if more callers than instances run at once."""
        session = self._idle.get()
        try:
            return session.run(feeds)
        finally:
            self._idle.put(session)

    # -- ManagedSession: what the engine reports and steers ------------------------------
    @property
    def candidate(self) -> Backend | None:
        first = self.first
        return first.candidate if isinstance(first, ManagedSession) else None

    def set_power_mode(self, mode: str) -> None:
        for session in self.sessions:
            if isinstance(session, ManagedSession):
                session.set_power_mode(mode)

    def status(self) -> dict[str, Any]:
        """The first instance's state, the plan, and each instance's active backend."""
        first = self.first
        status = dict(first.status()) if isinstance(first, ManagedSession) else {}
        status["plan"] = self.plan.to_dict()
        status["instances"] = [
            s.status().get("active") if isinstance(s, ManagedSession) else None
            for s in self.sessions
        ]
        return status

    @property
    def closed(self) -> bool:
        return all(getattr(s, "closed", False) for s in self.sessions)

    def close(self) -> None:
        for session in self.sessions:
            session.close()
