"""The registry builds nothing itself: a builder wraps sessions, hooks see loads and unloads,
the daemon's gauge hooks follow every version, and the warm-up feeds the shared sample input.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.canary_judge import CanaryPolicy
from edgeagent.engine.gauges import ModelGauges
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.plan import ServingPlan
from edgeagent.engine.registry import ModelRegistry
from edgeagent.engine.serving import LoadedModel, ModelFactory
from edgeagent.engine.settings import EngineSettings
from edgeagent.models.golden import sample_feeds
from edgeagent.models.session import open_variant
from tests.support.helpers import serving_registry, write_tiny_package

X = np.ones((1, 3, 8, 8), np.float32)


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


async def test_builder_and_hooks_see_every_version(tmp_path: Path, executor):
    settings = EngineSettings()
    factory = ModelFactory(
        settings, executor=executor, metrics=EngineMetrics(CollectorRegistry()), load=LoadCounter()
    )
    built: list[LoadedModel] = []
    loaded: list[str] = []
    unloaded: list[str] = []

    def build(package, session):
        built.append(factory.build(package, session))
        return built[-1]

    registry = ModelRegistry(
        open_variant,
        build,
        settings=settings,
        executor=executor,
        on_model_load=[lambda m: loaded.append(m.version)],
        on_model_unload=[lambda m: unloaded.append(m.version)],
    )
    registry.add(write_tiny_package(tmp_path / "v1"))
    first = await registry.load("tiny")
    assert built == [first] and loaded == ["1"] and unloaded == []
    await registry.activate(write_tiny_package(tmp_path / "v2", version="2"))
    assert loaded == ["1", "2"] and unloaded == ["1"]  # the old version drained, then went
    await registry.unload("tiny")
    assert unloaded == ["1", "2"]


async def test_gauge_hooks_add_and_remove_each_versions_series(tmp_path: Path, executor):
    prom = CollectorRegistry()
    registry = serving_registry(open_variant, executor=executor, metrics=EngineMetrics(prom))
    registry.add(write_tiny_package(tmp_path / "v1"))
    model = await registry.load("tiny")
    labels = {"model": "tiny", "version": "1", **model.backend}
    assert prom.get_sample_value("edgeagent_model_loaded", labels) == 1
    assert prom.get_sample_value("edgeagent_queue_depth", {"model": "tiny"}) == 0
    await registry.canary(write_tiny_package(tmp_path / "v2", version="2"), CanaryPolicy(share=0.5))
    assert prom.get_sample_value("edgeagent_model_loaded", {**labels, "version": "2"}) == 1
    await registry.unload("tiny")
    assert prom.get_sample_value("edgeagent_model_loaded", labels) is None
    assert prom.get_sample_value("edgeagent_model_loaded", {**labels, "version": "2"}) is None
    assert prom.get_sample_value("edgeagent_queue_depth", {"model": "tiny"}) is None


async def test_canary_is_judged_when_its_requests_finish_not_on_lookup(tmp_path: Path, executor):
    registry = serving_registry(
        open_variant,
        executor=executor,
    )
    registry.add(write_tiny_package(tmp_path / "v1", seed=1))
    await registry.load("tiny")
    policy = CanaryPolicy(share=0.5, min_requests=4, max_p99_ratio=100)
    await registry.canary(write_tiny_package(tmp_path / "v2", version="2", seed=2), policy)
    canary = registry.get("tiny", "2")  # a versioned lookup: never routed, never judging
    for _ in range(4):
        await canary.infer({"input": X})
    status = registry.status()["tiny"]  # no unversioned lookup happened since
    assert status["last_canary"] == "version 2 promoted"
    assert status["active_version"] == "2" and status["canary"] is None
    for _ in range(3):  # lookups change nothing
        registry.get("tiny")
    assert registry.status()["tiny"] == status
    await registry.close()


async def test_warm_up_feeds_the_shared_sample_input(tmp_path: Path, executor):
    seen: list[dict] = []

    def opener(package):
        session = open_variant(package)
        run = session.run

        def recording(feeds):
            seen.append(dict(feeds))
            return run(feeds)

        session.run = recording
        return session

    registry = serving_registry(opener, executor=executor)
    registry.add(write_tiny_package(tmp_path / "v1"))
    model = await registry.load("tiny")
    (warm,) = seen
    expected = sample_feeds(model.package)
    assert warm.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(warm[name], array)
    await registry.close()


def test_gauges_remember_labels_across_a_backend_change() -> None:
    """A failover changes a version's backend; its series is still the one removed."""
    prom = CollectorRegistry()
    gauges = ModelGauges(EngineMetrics(prom))

    class Model:
        name, version, queued = "m", "1", 0
        backend = {"runtime": "a", "device": "x", "precision": "fp32"}
        plan = ServingPlan(1, 8, 0.002)
        session = None  # not an instance group: no per-instance series

    model = Model()
    gauges.on_load(model)  # type: ignore[arg-type]
    model.backend = {"runtime": "b", "device": "y", "precision": "fp32"}
    gauges.on_unload(model)  # type: ignore[arg-type]
    assert (
        prom.get_sample_value(
            "edgeagent_model_loaded",
            {"model": "m", "version": "1", "runtime": "a", "device": "x", "precision": "fp32"},
        )
        is None
    )
