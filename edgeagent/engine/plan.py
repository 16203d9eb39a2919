"""The execution plan of a loaded variant: instances, threads per instance, batch, queue delay.

The configuration says what is fixed (``[server] plan``, ``plan_instances``, ``plan_threads``,
``max_batch_size``, ``max_queue_delay_ms``, each falling back to the package's ``[serving]``
value); the hardware layer measures the rest on the device at load (``hardware.plan_search``)
and the session it opens carries the result (``hardware.instances.InstanceGroup.plan``). This
module turns the one into a ``PlanRequest`` and the other into what the batcher runs and what
status and metrics show, so that neither the batcher nor the hardware layer reads the other's
settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeagent.engine.feeds import can_batch
from edgeagent.engine.settings import EngineSettings
from edgeagent.hardware.plan_search import PENDING, MeasuredPlan, PlanRequest
from edgeagent.models.package import ModelPackage
from edgeagent.runtimes.base import Session


def plan_request(settings: EngineSettings, package: ModelPackage) -> PlanRequest:
    """What the search may choose for ``package``: [server] keys where set, else [serving].

    ``max_batch_size`` is the largest batch a client may send and the most rows the search
    tries; a model whose tensors cannot be concatenated is searched at batch 1 only.
    """
    hints = package.serving
    mode = settings.plan or hints.plan
    max_batch = settings.max_batch_size or hints.max_batch_size
    if not can_batch(package.inputs, package.outputs):
        max_batch = 1
    return PlanRequest(
        auto=mode == "auto",
        instances=settings.plan_instances or hints.instances,
        threads=settings.plan_threads or hints.threads,
        max_batch=max_batch,
        search_s=settings.plan_search_s,
        disagreement=settings.plan_disagreement,
        lone=settings.plan_lone_session,
    )


@dataclass(frozen=True)
class ServingPlan:
    """What the batcher runs: ``instances`` batches at once, each of at most ``batch`` rows
    merged from waiting requests, after at most ``max_queue_delay_s`` of waiting."""

    instances: int
    batch: int
    max_queue_delay_s: float
    measured: MeasuredPlan | None = None  # None: a session opened without a plan

    @property
    def pending(self) -> bool:
        """Serving on a safe plan until the search measures this variant (``registry``)."""
        return self.measured is not None and self.measured.source == PENDING

    def to_dict(self) -> dict[str, Any]:
        """The "plan" of a version in /v1/status, with the figures that chose it."""
        shown: dict[str, Any] = {"instances": self.instances, "max_batch_size": self.batch}
        shown["max_queue_delay_ms"] = round(self.max_queue_delay_s * 1e3, 3)
        if self.measured is None:
            return {**shown, "source": "default", "threads": None}
        measured = self.measured.to_dict()
        for key in ("instances", "batch"):
            measured.pop(key)
        return {**shown, **measured}


def measured_plan(session: Session) -> MeasuredPlan | None:
    """The plan an InstanceGroup carries; None for a session opened without one."""
    plan = getattr(session, "plan", None)
    return plan if isinstance(plan, MeasuredPlan) else None


def serving_plan(session: Session, max_batch_size: int, max_queue_delay_s: float) -> ServingPlan:
    """The batcher's plan for ``session``: its measured shape, or one instance merging up to
    ``max_batch_size`` rows (the behaviour before plans) when it carries none."""
    measured = measured_plan(session)
    if measured is None:
        return ServingPlan(1, max_batch_size, max_queue_delay_s)
    batch = min(measured.shape.batch, max_batch_size)
    instances = getattr(session, "instances", measured.shape.instances)
    return ServingPlan(int(instances), max(1, batch), max_queue_delay_s, measured)
