"""Several execution instances of one variant — on one device or several — behind one Session.

An instance is an independent session with its own intra-op threads (``plan_search``): two
single-threaded instances of MobileNetV2 on two cores beat one two-threaded one by 1.49×,
because while one instance finishes a batch the other already runs the next. With
``[hardware] spread`` the instances sit on several devices (``spread``), a *lane* per device
with that device's own plan. The batcher runs up to ``instances`` batches at once (every lane's
instances together); each batch is placed (``place``) on the instance expected to finish it
first (``schedule``), and an instance is never entered by two threads. Each instance is a
``ResilientSession`` of its own, so one that faults fails over without stopping the others; a
batch whose instance lost its device is run again on another instance, not failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeagent.hardware.plan_search import SEARCH_BATCHES, MeasuredPlan, PlanShape
from edgeagent.hardware.profile import Candidate
from edgeagent.hardware.schedule import Instance, Scheduler, ServiceTime, Ticket
from edgeagent.hardware.spread import device_key
from edgeagent.runtimes.base import Backend, Session, TensorInfo, is_managed
from edgeagent.runtimes.remote import is_remote


@dataclass(frozen=True)
class Lane:
    """One device's instances and the execution plan they run."""

    device: str  # the device key (``spread.device_key``)
    plan: MeasuredPlan
    sessions: Sequence[Session]


def device_of(session: Session) -> str:
    """The device key a session runs on now: its active candidate's, else its own name."""
    if is_managed(session) and isinstance(session.candidate, Candidate):
        return device_key(session.candidate)
    return str(session.device)


def plan_prior(plan: MeasuredPlan) -> dict[int, float]:
    """Seconds per batch of one instance, by batch size, from the plan search's figures (rows/s
    of all the plan's instances together): where an instance's EWMA starts."""
    shape = plan.shape
    prior = {}
    # A search measures batch sizes up to the largest of SEARCH_BATCHES (plan_search.shapes).
    for rows in {*range(1, max(SEARCH_BATCHES) + 1), shape.batch}:
        figure = plan.figures.get(PlanShape(shape.instances, shape.threads, rows).label, 0.0)
        if figure > 0:
            prior[rows] = rows * shape.instances / figure
    return prior


class Placement:
    """Where one batch runs: a reserved instance of a group, or a plain session.

    ``device`` is what the device gate admits the batch to; ``run`` runs it; ``cancel`` gives
    the reservation back when no batch was formed after all.
    """

    def __init__(
        self, session: Session, device: str, group: InstanceGroup | None, ticket: Ticket | None
    ) -> None:
        self.session = session
        self.device = device
        self._group = group
        self._ticket = ticket

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._group is None or self._ticket is None:
            return self.session.run(feeds)
        return self._group.run_ticket(self._ticket, feeds)

    def cancel(self) -> None:
        if self._group is not None and self._ticket is not None:
            self._group.scheduler.finish(self._ticket, None)


def place(
    session: Session, rows: int, waiting: int = 0, delay: Callable[[str], float] | None = None
) -> Placement:
    """The placement of a batch of ``rows`` with ``waiting`` rows queued behind it."""
    if isinstance(session, InstanceGroup):
        return session.reserve(rows, waiting, delay)
    return Placement(session, device_of(session), None, None)


class InstanceGroup(Session):
    """``sessions`` instances of one variant under ``plan``, and optionally more lanes on other
    devices (``spread``); ``run`` goes to the instance expected to finish first."""

    def __init__(
        self,
        sessions: Sequence[Session],
        plan: MeasuredPlan,
        spread: Sequence[Lane] = (),
        clock: Callable[[], float] = time.monotonic,
        lone: Session | None = None,
    ) -> None:
        if not sessions:
            raise ValueError("an instance group needs at least one session")
        first = Lane(device_of(sessions[0]), plan, list(sessions))
        self.lanes = [first, *spread]
        self.plan = plan  # the first (best-ranked) lane's: what the batcher merges batches to
        self.sessions = [s for lane in self.lanes for s in lane.sessions]
        self.lone = lone  # all the cores, for a request alone on an idle device (schedule)
        self.scheduler = Scheduler(
            [
                Instance(s, lane.device, ServiceTime(plan_prior(lane.plan)))
                for lane in self.lanes
                for s in lane.sessions
            ],
            clock,
            lone=None if lone is None else Instance(lone, first.device),
        )
        self._clock = clock

    @property
    def instances(self) -> int:
        return len(self.sessions)

    def fork(self) -> Session:
        return self.first.fork()

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

    def reserve(
        self, rows: int, waiting: int = 0, delay: Callable[[str], float] | None = None
    ) -> Placement:
        """Reserve the instance expected to finish a batch of ``rows`` first."""
        ticket = self.scheduler.reserve(rows, waiting, delay or (lambda device: 0.0))
        return Placement(ticket.instance.session, ticket.instance.device, self, ticket)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on the instance expected to finish first (blocks while it is busy)."""
        return self.reserve(_rows(feeds)).run(feeds)

    def run_ticket(self, ticket: Ticket, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a reserved batch. An instance that lost its device (no working candidate left
        after its failover) hands the batch to another instance, which is tried once each."""
        tried: list[Instance] = []
        while True:
            instance = ticket.instance
            try:
                return self._run_on(ticket, feeds)
            except Exception:
                tried.append(instance)
                if instance.available or len(tried) >= len(self.scheduler.instances):
                    raise  # a fault of this batch, not of the device: the caller is told
                ticket = self.scheduler.reserve(_rows(feeds), exclude=tried)

    def _run_on(self, ticket: Ticket, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        instance = ticket.instance
        seconds = None
        with instance.lock:
            self.scheduler.start(ticket, _rows(feeds))
            began = self._clock()
            try:
                outputs = instance.session.run(feeds)
                seconds = self._clock() - began
            finally:
                self.scheduler.finish(ticket, seconds)
        return outputs

    # -- ManagedSession: what the engine reports and steers ------------------------------
    @property
    def candidate(self) -> Backend | None:
        first = self.first
        return first.candidate if is_managed(first) else None

    def set_power_mode(self, mode: str) -> None:
        for session in self._every_session():
            if is_managed(session):
                session.set_power_mode(mode)

    def status(self) -> dict[str, Any]:
        """The first instance's state, the plan, and each instance's device, backend, plan,
        EWMA latency and share of batches; candidates of every lane."""
        first = self.first
        status = dict(first.status()) if is_managed(first) else {}
        status["plan"] = self.plan.to_dict()
        lanes = {id(s): lane for lane in self.lanes for s in lane.sessions}
        shown = []
        for session, figures in zip(self.sessions, self.scheduler.figures(), strict=True):
            managed = session.status() if is_managed(session) else {}
            plan = lanes[id(session)].plan
            shown.append({**figures, "active": managed.get("active"), "plan": plan.shape.label})
            known = {c["candidate"] for c in status.get("candidates", [])}
            extra = [c for c in managed.get("candidates", []) if c["candidate"] not in known]
            if extra:  # another lane's own candidates
                status["candidates"] = [*status.get("candidates", []), *extra]
        status["instances"] = shown
        lone = self.scheduler.lone
        if lone is not None:
            status["lone"] = {
                "device": lone.device,
                "available": lone.available,
                "ewma_ms": lone.times.measured_ms(),
                "batches": lone.batches,
            }
        if len(self.lanes) > 1:
            status["spread"] = [
                {"device": lane.device, "instances": len(lane.sessions), **lane.plan.to_dict()}
                for lane in self.lanes
            ]
        return status

    def _every_session(self) -> list[Session]:
        return [*self.sessions, *([self.lone] if self.lone is not None else [])]

    @property
    def closed(self) -> bool:
        return all(getattr(s, "closed", False) for s in self._every_session())

    def close(self) -> None:
        for session in self._every_session():
            session.close()


def offloads(session: Session) -> bool:
    """Whether ``session`` has a peer in the rotation now: a request the governor would shed to
    spare this board can go there instead (the scheduler still weighs this board's pacing)."""
    if not isinstance(session, InstanceGroup):
        return False
    return any(is_remote(i.device) and i.available for i in session.scheduler.instances)


def spare_peer(session: Session, rows: int) -> Placement | None:
    """A peer instance in the rotation with nothing reserved on it, reserved for one batch of
    ``rows`` now; None when there is none. Where a request goes that the local queue, full,
    would refuse: the peer has room at once, so it is answered instead of told to retry."""
    if not isinstance(session, InstanceGroup):
        return None
    ticket = session.scheduler.reserve_idle(rows, lambda instance: is_remote(instance.device))
    if ticket is None:
        return None
    return Placement(ticket.instance.session, ticket.instance.device, session, ticket)


def _rows(feeds: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(feeds.values()))) if feeds else 1
