"""Which instance runs the next batch: the one expected to finish it first.

Instances of one model on different devices serve at different speeds (an NPU beside the CPU,
two GPUs of different generations), so handing batches out in turn would queue work on the
slow device while the fast one idles. Each instance keeps what it measured — an EWMA of its
service time per batch size — and the batches reserved on it; a batch goes to the instance
expected to finish it first: the work queued ahead of it there (what is left of the running
batch plus the reserved ones behind it, or the device's pacing wait if longer) plus its own
service time for that many rows. A fast device therefore takes proportionally more, and an idle
slow one still takes a batch when the fast one is busy enough that the slow one finishes sooner.

The batcher runs at most one batch per instance at once, so a batch queued behind a busy
instance holds a slot an idle instance could have used. When requests wait behind the batch
(``waiting`` rows), a busy instance is charged for them too — it would serve them after this
one — which keeps every instance busy under load without ever sending a lone batch to a much
slower device.

A *lone* instance (optional) is a session of all the cores beside instances of fewer threads
each: a batch of one row that arrives while every instance of its device is idle runs there,
so a lone client is served by every core (the plan's single-threaded instances win under
load, and double a lone request's latency); any other batch never goes to it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeagent.runtimes.base import Session, is_managed

ALPHA = 0.2  # weight of the newest sample in a service-time EWMA


class ServiceTime:
    """One instance's measured service time per batch size (an EWMA each), with a prior.

    A batch size not measured yet is estimated from the nearest one measured, scaled per row
    (an over-estimate on devices whose cost is per batch: a conservative guess), else from
    ``prior`` (rows → seconds, e.g. the plan search's figures), else unknown (None).
    """

    def __init__(self, prior: Mapping[int, float] | None = None, alpha: float = ALPHA) -> None:
        self._alpha = alpha
        self._prior = dict(prior or {})
        self._ewma: dict[int, float] = {}
        self._counts: dict[int, int] = {}

    def observe(self, rows: int, seconds: float) -> None:
        old = self._ewma.get(rows)
        self._ewma[rows] = seconds if old is None else old + self._alpha * (seconds - old)
        self._counts[rows] = self._counts.get(rows, 0) + 1

    def typical(self) -> float | None:
        """The EWMA of the batch size run most often (what a metric shows), None before any."""
        if not self._counts:
            return None
        return self._ewma[max(self._counts, key=lambda rows: (self._counts[rows], rows))]

    def estimate(self, rows: int) -> float | None:
        if rows in self._ewma:
            return self._ewma[rows]
        known = self._ewma or self._prior
        if not known:
            return None
        nearest = min(known, key=lambda r: (abs(r - rows), r))
        return known[nearest] * rows / nearest

    def measured_ms(self) -> dict[str, float]:
        """The EWMAs for status, in milliseconds by batch size."""
        return {str(rows): round(s * 1e3, 3) for rows, s in sorted(self._ewma.items())}


@dataclass(eq=False)
class Ticket:
    """One batch reserved on one instance; ``started`` once its run holds the instance."""

    instance: Instance
    rows: int
    expected_s: float
    started: float | None = None

    def remaining(self, now: float) -> float:
        if self.started is None:
            return self.expected_s
        return max(0.0, self.expected_s - (now - self.started))


@dataclass(eq=False)
class Instance:
    """One execution instance: a session on one device, run by one thread at a time."""

    session: Session
    device: str  # the device key (``spread.device_key``): what the device gate admits to
    times: ServiceTime = field(default_factory=ServiceTime)
    tickets: list[Ticket] = field(default_factory=list)
    batches: int = 0
    rows: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def available(self) -> bool:
        """False while its session has no working backend (its device is gone): it leaves the
        rotation until its re-probe brings a candidate back."""
        session = self.session
        return not is_managed(session) or session.candidate is not None

    def backlog(self, now: float) -> float:
        return sum(ticket.remaining(now) for ticket in self.tickets)


class Scheduler:
    """Earliest expected completion over a fixed set of instances (see the module docstring)."""

    def __init__(
        self,
        instances: Sequence[Instance],
        clock: Callable[[], float] = time.monotonic,
        lone: Instance | None = None,
    ) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one instance")
        self.instances = list(instances)
        self.lone = lone
        self._clock = clock
        self._lock = threading.Lock()

    def _alone(self, rows: int, waiting: int, exclude: Sequence[Instance]) -> bool:
        """Whether this batch is a lone request on an idle device (module docstring)."""
        lone = self.lone
        if lone is None or rows != 1 or waiting > 0 or lone in exclude or lone.tickets:
            return False
        idle = all(not i.tickets for i in self.instances if i.device == lone.device)
        return idle and lone.available

    def reserve(
        self,
        rows: int,
        waiting: int = 0,
        delay: Callable[[str], float] = lambda device: 0.0,
        exclude: Sequence[Instance] = (),
    ) -> Ticket:
        """Reserve the instance expected to finish ``rows`` first; ``waiting`` rows queue behind
        the batch, ``delay(device)`` is how long the device's gate would hold it back."""
        rows = max(1, rows)
        with self._lock:
            if self.lone is not None and self._alone(rows, waiting, exclude):
                estimate = self.lone.times.estimate(rows)
                ticket = Ticket(self.lone, rows, 0.0 if estimate is None else estimate)
                self.lone.tickets.append(ticket)
                return ticket
            now = self._clock()
            usable = [i for i in self.instances if i.available and i not in exclude]
            usable = usable or [i for i in self.instances if i not in exclude] or self.instances
            estimates = {id(i): i.times.estimate(rows) for i in usable}
            known = [e for e in estimates.values() if e is not None]
            neutral = sum(known) / len(known) if known else 0.0  # an unmeasured ticket's cost
            later = math.ceil(max(0, waiting) / rows)  # batches that will follow this one

            def finish(instance: Instance) -> tuple[float, int, int]:
                service = estimates[id(instance)]
                service = 0.0 if service is None else service  # unmeasured: worth a try
                ahead = instance.backlog(now)
                cost = ahead + service * (1 + later) if ahead > 0 else service
                wait = delay(instance.device)
                return max(cost, wait + service), len(instance.tickets), usable.index(instance)

            chosen = min(usable, key=finish)
            service = estimates[id(chosen)]
            ticket = Ticket(chosen, rows, neutral if service is None else service)
            chosen.tickets.append(ticket)
            return ticket

    def reserve_idle(self, rows: int, eligible: Callable[[Instance], bool]) -> Ticket | None:
        """Reserve the fastest ``eligible`` instance in the rotation with nothing reserved on
        it, or None when every one is busy: a batch that may only start at once, or not at all."""
        with self._lock:
            idle = [i for i in self.instances if eligible(i) and i.available and not i.tickets]
            if not idle:
                return None
            estimates = {id(i): i.times.estimate(max(1, rows)) for i in idle}
            chosen = min(idle, key=lambda i: math.inf if (e := estimates[id(i)]) is None else e)
            estimate = estimates[id(chosen)]
            ticket = Ticket(chosen, max(1, rows), 0.0 if estimate is None else estimate)
            chosen.tickets.append(ticket)
            return ticket

    def start(self, ticket: Ticket, rows: int) -> None:
        """The ticket's run holds its instance now, with ``rows`` rows (known only then)."""
        with self._lock:
            estimate = ticket.instance.times.estimate(rows)
            ticket.rows = rows
            ticket.expected_s = ticket.expected_s if estimate is None else estimate
            ticket.started = self._clock()

    def finish(self, ticket: Ticket, seconds: float | None) -> None:
        """The run ended (``seconds`` of service) or failed/was cancelled (None)."""
        with self._lock:
            instance = ticket.instance
            if ticket in instance.tickets:
                instance.tickets.remove(ticket)
            if seconds is not None:
                instance.times.observe(ticket.rows, seconds)
                instance.batches += 1
                instance.rows += ticket.rows

    FIELDS = ("service_seconds", "batches", "share", "in_flight")  # figure()'s, for metrics

    def figure(self, index: int, name: str) -> float:
        """One of ``FIELDS`` of instance ``index`` now (NaN: no service time measured yet)."""
        instance = self.instances[index]
        if name == "service_seconds":
            typical = instance.times.typical()
            return math.nan if typical is None else typical
        if name == "batches":
            return float(instance.batches)
        if name == "share":
            return instance.batches / (sum(i.batches for i in self.instances) or 1)
        if name == "in_flight":
            return float(len(instance.tickets))
        raise ValueError(f"no instance figure {name!r} (known: {', '.join(self.FIELDS)})")

    def figures(self) -> list[dict[str, Any]]:
        """Per instance: its device, EWMA latency by batch size, batches, share, in flight."""
        with self._lock:
            total = sum(i.batches for i in self.instances) or 1
            return [
                {
                    "device": i.device,
                    "available": i.available,
                    "ewma_ms": i.times.measured_ms(),
                    "batches": i.batches,
                    "rows": i.rows,
                    "share": round(i.batches / total, 4),
                    "in_flight": len(i.tickets),
                }
                for i in self.instances
            ]
