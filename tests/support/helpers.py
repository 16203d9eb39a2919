"""Small real artefacts for tests: a tiny ONNX classifier and a model package around it.

Built with the ``onnx`` helper API (no torch), so unit tests run in seconds; the zoo's real
networks are exercised by the integration tests.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from prometheus_client import CollectorRegistry

from devtools.tiny import write_tiny_onnx, write_tiny_package  # noqa: F401 - re-exported
from devtools.zoo import zoo_dir  # noqa: F401 - re-exported: one lookup for tests and benches
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.gauges import ModelGauges
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.registry import ModelRegistry
from edgeagent.engine.serving import ModelFactory
from edgeagent.engine.settings import EngineSettings
from edgeagent.models.package import ModelPackage
from edgeagent.runtimes import Session

REPO = Path(__file__).resolve().parents[2]


def serving_registry(
    opener: Callable[[ModelPackage], Session],
    *,
    executor: Executor,
    settings: EngineSettings | None = None,
    metrics: EngineMetrics | None = None,
    limits: Callable[[], ServingLimits] = lambda: UNTHROTTLED,
    load: LoadCounter | None = None,
    plan: Callable[[ModelPackage], Session] | None = None,
) -> ModelRegistry:
    """A ModelRegistry wired as the daemon wires it: ModelFactory plus the gauge hooks, and
    ``plan`` to open a version under its measured plan after it serves on a pending one."""
    settings = settings or EngineSettings()
    metrics = metrics or EngineMetrics(CollectorRegistry())
    factory = ModelFactory(
        settings,
        executor=executor,
        metrics=metrics,
        load=load or LoadCounter(),
        limits_provider=limits,
    )
    gauges = ModelGauges(metrics)
    return ModelRegistry(
        opener,
        factory.build,
        settings=settings,
        executor=executor,
        on_model_load=[gauges.on_load],
        on_model_unload=[gauges.on_unload],
        plan=plan,
    )
