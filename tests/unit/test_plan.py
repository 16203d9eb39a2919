"""Execution plans (issue 28): N instances really run at once, the plan reaches the batcher,
status and metrics, the config and model.toml decide what the search may choose."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from devtools.package import read_model_toml, write_model_toml
from devtools.waiting import until
from edgeagent.config import parse_config
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.errors import DeadlineExceeded
from edgeagent.engine.gauges import ModelGauges
from edgeagent.engine.limits import ServingLimits
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.plan import plan_request
from edgeagent.engine.serving import ModelFactory
from edgeagent.engine.settings import EngineSettings
from edgeagent.hardware.instances import InstanceGroup
from edgeagent.hardware.plan_search import MeasuredPlan, PlanShape
from edgeagent.models.package import PackageError, load_package
from edgeagent.sections import ConfigError
from tests.support.fixed_time import FixedTimeSession
from tests.support.helpers import write_tiny_package

SERVICE_S = 0.05  # the simulated accelerator's fixed service time per batch


def most_at_once(intervals: list[tuple[str, float, float]]) -> int:
    """The largest number of recorded intervals that overlap at one instant."""
    events = sorted([(b, 1) for _, b, _ in intervals] + [(e, -1) for _, _, e in intervals])
    running = best = 0
    for _, step in events:
        running += step
        best = max(best, running)
    return best


def serving(root: Path, **values) -> None:
    """Set (or with None drop) keys of the package's [serving] table."""
    data = read_model_toml(root)
    table = data.setdefault("serving", {})
    for key, value in values.items():
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    write_model_toml(root, data)


def group(count: int, intervals: list, batch: int = 1, hold=None) -> InstanceGroup:
    plan = MeasuredPlan(PlanShape(count, 1, batch), "search", count, {"2x1:b1": 40.0})
    return InstanceGroup(
        [
            FixedTimeSession(service_s=SERVICE_S, name=f"i{i}", hold=hold, intervals=intervals)
            for i in range(count)
        ],
        plan,
    )


def factory(metrics: EngineMetrics, executor, **settings) -> ModelFactory:
    return ModelFactory(
        EngineSettings(**settings), executor=executor, metrics=metrics, load=LoadCounter()
    )


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


@pytest.mark.parametrize("instances", [1, 2])
async def test_n_instances_run_n_batches_at_once(tmp_path: Path, executor, instances) -> None:
    """8 requests on 2 instances of a fixed-time device: 2 batches always overlap, 8 batches
    take 4 service times of the device; 1 instance runs them one after another."""
    package = load_package(write_tiny_package(tmp_path / "pkg"))
    intervals: list[tuple[str, float, float]] = []
    sessions = group(instances, intervals)
    model = factory(EngineMetrics(CollectorRegistry()), executor).build(package, sessions)
    assert model.plan.instances == instances and model.plan.batch == 1
    feeds = [{"input": np.full((1, 3, 8, 8), i, np.float32)} for i in range(8)]
    answers = await asyncio.gather(*(model.infer(f) for f in feeds))
    for i, answer in enumerate(answers):  # each request its own rows, whichever instance ran it
        assert answer["logits"][0, 0] == i
    assert len(intervals) == 8
    assert most_at_once(intervals) == instances
    assert all(s.max_inside == 1 for s in sessions.sessions)  # no instance entered twice
    busy = {name for name, _, _ in intervals}
    assert len(busy) == instances  # every instance served
    await model.close(5)


async def test_instances_keep_deadlines_and_drain_on_close(tmp_path: Path, executor) -> None:
    """A request that waits past its deadline fails alone; close answers what was queued.

    While both instances run, one batch per instance is formed ahead and waits on it (the
    expired request's among them: it still runs, its answer dropped); the rest stay queued."""
    package = load_package(write_tiny_package(tmp_path / "pkg"))
    intervals: list[tuple[str, float, float]] = []
    hold = threading.Event()
    sessions = group(2, intervals, hold=hold)
    model = factory(EngineMetrics(CollectorRegistry()), executor).build(package, sessions)
    feeds = {"input": np.zeros((1, 3, 8, 8), np.float32)}
    busy = [asyncio.ensure_future(model.infer(feeds)) for _ in range(2)]
    await until(lambda: all(s.inside == 1 for s in sessions.sessions), what="both instances busy")
    with pytest.raises(DeadlineExceeded):
        await model.infer(feeds, timeout_s=0.01)
    queued = [asyncio.ensure_future(model.infer(feeds)) for _ in range(4)]
    await until(lambda: model.queued == 3, what="1 formed ahead, 3 requests queued")
    closing = asyncio.ensure_future(model.close(10))
    await until(lambda: model._batcher.closing, what="closing")
    hold.set()
    await closing  # drained: every queued request answered, none failed
    assert len(intervals) == 7
    assert all(s.max_inside == 1 for s in sessions.sessions)  # a batch ahead waits its turn
    for future in [*busy, *queued]:
        assert future.result()["logits"].shape == (1, 4)


@pytest.mark.parametrize(
    ("limits", "formed_ahead"),
    [
        (ServingLimits(), 2),
        (ServingLimits(duty_cycle=0.999), 0),
        (ServingLimits(max_concurrency=8), 0),
    ],
)
async def test_batches_are_formed_ahead_only_while_the_governor_lets_them_run(
    tmp_path: Path, executor, limits: ServingLimits, formed_ahead: int
) -> None:
    """Unthrottled, each busy instance gets its next batch at once (no idle gap while the
    loop forms one); paced or capped, a batch is formed only for an idle instance, so it
    starts when the gate admitted it."""
    package = load_package(write_tiny_package(tmp_path / "pkg"))
    hold = threading.Event()
    sessions = group(2, [], hold=hold)
    asked = []  # every read of the limits: the loop's decisions

    def provider() -> ServingLimits:
        asked.append(1)
        return limits

    made = ModelFactory(
        EngineSettings(),
        executor=executor,
        metrics=EngineMetrics(CollectorRegistry()),
        load=LoadCounter(),
        limits_provider=provider,
    )
    model = made.build(package, sessions)
    feeds = {"input": np.zeros((1, 3, 8, 8), np.float32)}
    running = [asyncio.ensure_future(model.infer(feeds)) for _ in range(2)]
    await until(lambda: all(s.inside == 1 for s in sessions.sessions), what="both instances busy")
    before = len(asked)
    waiting = [asyncio.ensure_future(model.infer(feeds)) for _ in range(4)]
    # The loop woke for them and decided (it reads the limits for each decision).
    await until(lambda: len(asked) > before + 4, what="the loop's decisions")
    await until(lambda: model.queued == 4 - formed_ahead, what=f"{formed_ahead} formed ahead")
    assert model.queued == 4 - formed_ahead
    hold.set()
    await asyncio.gather(*running, *waiting)
    await model.close(5)


async def test_the_plan_shows_in_status_and_metrics(tmp_path: Path, executor) -> None:
    package = load_package(write_tiny_package(tmp_path / "pkg"))
    prom = CollectorRegistry()
    metrics = EngineMetrics(prom)
    model = factory(metrics, executor).build(package, group(2, [], batch=4))
    gauges = ModelGauges(metrics)
    gauges.on_load(model)
    shown = model.plan.to_dict()
    assert shown["instances"] == 2 and shown["threads"] == 1 and shown["max_batch_size"] == 4
    assert shown["source"] == "search" and shown["figures"] == {"2x1:b1": 40.0}
    assert model.max_batch_size == 4  # what clients may send stays the package's
    labels = {"model": "tiny", "version": model.version, "source": "search"}
    assert prom.get_sample_value("edgeagent_execution_plan", {**labels, "field": "instances"}) == 2
    assert prom.get_sample_value("edgeagent_execution_plan", {**labels, "field": "threads"}) == 1
    gauges.on_unload(model)
    assert prom.get_sample_value("edgeagent_execution_plan", {**labels, "field": "threads"}) is None
    await model.close(5)


def test_a_session_without_plan_serves_as_before(tmp_path: Path, executor) -> None:
    package = load_package(write_tiny_package(tmp_path / "pkg"))
    made = factory(EngineMetrics(CollectorRegistry()), executor)
    policy = made.policy(package, FixedTimeSession(service_s=SERVICE_S))
    assert policy.instances == 1 and policy.merge_batch_size == 4
    assert (
        made.plan(package, FixedTimeSession(service_s=SERVICE_S)).to_dict()["source"] == "default"
    )


def test_plan_request_from_config_and_model_toml(tmp_path: Path) -> None:
    root = write_tiny_package(tmp_path / "pkg")
    package = load_package(root)
    request = plan_request(EngineSettings(), package)
    assert request.auto and request.instances is None and request.max_batch == 4
    serving(root, plan="fixed", instances=2, threads=1)
    package = load_package(root)
    request = plan_request(EngineSettings(), package)
    assert not request.auto and (request.instances, request.threads) == (2, 1)
    # [server] keys win over the package's, as max_batch_size always did.
    config = parse_config('[server]\nplan = "auto"\nplan_threads = 2\nmax_batch_size = 2\n')
    request = plan_request(config.engine, package)
    assert request.auto and (request.instances, request.threads, request.max_batch) == (2, 2, 2)


def test_plan_settings_refuse_nonsense(tmp_path: Path) -> None:
    for bad in ('plan = "fast"', "plan_instances = 0", "plan_search_s = 0", "plan_threads = -1"):
        with pytest.raises(ConfigError):
            parse_config(f"[server]\n{bad}\n")
    root = write_tiny_package(tmp_path / "pkg")
    for key, value in (("plan", "sometimes"), ("instances", 0), ("threads", 1000)):
        serving(root, **{key: value})
        with pytest.raises(PackageError, match=key):
            load_package(root)
        serving(root, **{key: None})
