"""Per-model gauges, registered and removed by the registry's load and unload hooks.

``edgeagent_model_loaded`` has one series per serving version and backend, and
``edgeagent_queue_depth`` one per model name, summed over its live versions (a canary and its
stable version queue separately). ``edgeagent_execution_plan`` has one series per field of a
version's execution plan (instances, threads, merged batch, the search's rows/s), and
``edgeagent_execution_instance`` one per instance and figure (its device, measured service
time, batches, share, in flight), read when scraped. The labels
are remembered at load time, so a version whose backend changed by failover still has its
series removed when it goes.
"""

from __future__ import annotations

from functools import partial

from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.serving import LoadedModel
from edgeagent.hardware.instances import InstanceGroup


class ModelGauges:
    """``on_load`` / ``on_unload`` for ``ModelRegistry(on_model_load=…, on_model_unload=…)``."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._metrics = metrics
        self._loaded_labels: dict[LoadedModel, tuple[str, ...]] = {}
        self._plan_labels: dict[LoadedModel, list[tuple[str, ...]]] = {}
        self._instance_labels: dict[LoadedModel, list[tuple[str, ...]]] = {}
        self._live: dict[str, set[LoadedModel]] = {}

    def on_load(self, model: LoadedModel) -> None:
        backend = model.backend
        labels = (
            model.name,
            model.version,
            backend["runtime"],
            backend["device"],
            backend["precision"],
        )
        self._loaded_labels[model] = labels
        self._metrics.loaded.labels(*labels).set(1)
        self._set_plan(model)
        self._set_instances(model)
        live = self._live.setdefault(model.name, set())
        live.add(model)
        self._metrics.queue_depth.labels(model.name).set_function(
            lambda: sum(m.queued for m in live)
        )

    def on_unload(self, model: LoadedModel) -> None:
        """Remove the version's series, but none that its successor of the same version (a
        reload, or the searched plan replacing a pending one) registered again."""
        labels = self._loaded_labels.pop(model, None)
        if labels is not None and labels not in self._loaded_labels.values():
            self._metrics.loaded.remove(*labels)
        for gauge, registered in (
            (self._metrics.plan, self._plan_labels),
            (self._metrics.instance, self._instance_labels),
        ):
            gone = registered.pop(model, [])
            kept = {series for other in registered.values() for series in other}
            for series in gone:
                if series not in kept:
                    gauge.remove(*series)
        live = self._live.get(model.name)
        if live is None:
            return
        live.discard(model)
        if not live:
            del self._live[model.name]
            self._metrics.queue_depth.remove(model.name)

    def _set_plan(self, model: LoadedModel) -> None:
        """One ``edgeagent_execution_plan`` series per field of the version's plan."""
        plan = model.plan.to_dict()
        values = {k: plan.get(k) for k in ("instances", "threads", "max_batch_size", "rows_per_s")}
        labels: list[tuple[str, ...]] = []
        for field, value in values.items():
            if value is None:
                continue
            series = (model.name, model.version, str(plan["source"]), field)
            self._metrics.plan.labels(*series).set(float(value))
            labels.append(series)
        self._plan_labels[model] = labels

    def _set_instances(self, model: LoadedModel) -> None:
        """One ``edgeagent_execution_instance`` series per instance and figure of a group."""
        group = model.session
        if not isinstance(group, InstanceGroup):
            return
        labels: list[tuple[str, ...]] = []
        for index, instance in enumerate(group.scheduler.instances):
            for field in group.scheduler.FIELDS:
                series = (model.name, model.version, str(index), instance.device, field)
                figure = partial(group.scheduler.figure, index, field)
                self._metrics.instance.labels(*series).set_function(figure)
                labels.append(series)
        self._instance_labels[model] = labels
