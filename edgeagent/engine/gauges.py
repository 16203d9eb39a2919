"""Per-model gauges, registered and removed by the registry's load and unload hooks.

``edgeagent_model_loaded`` has one series per serving version and backend, and
``edgeagent_queue_depth`` one per model name, summed over its live versions (a canary and its
stable version queue separately). The labels are remembered at load time, so a version whose
backend changed by failover still has its series removed when it goes.
"""

from __future__ import annotations

from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.serving import LoadedModel


class ModelGauges:
    """``on_load`` / ``on_unload`` for ``ModelRegistry(on_model_load=…, on_model_unload=…)``."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._metrics = metrics
        self._loaded_labels: dict[LoadedModel, tuple[str, ...]] = {}
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
        live = self._live.setdefault(model.name, set())
        live.add(model)
        self._metrics.queue_depth.labels(model.name).set_function(
            lambda: sum(m.queued for m in live)
        )

    def on_unload(self, model: LoadedModel) -> None:
        labels = self._loaded_labels.pop(model, None)
        if labels is not None:
            self._metrics.loaded.remove(*labels)
        live = self._live.get(model.name)
        if live is None:
            return
        live.discard(model)
        if not live:
            del self._live[model.name]
            self._metrics.queue_depth.remove(model.name)
