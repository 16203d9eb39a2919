"""Instances across devices (issue 28): batches go to the instance expected to finish first.

The scheduler is checked in simulated time (a fake clock and an event list: deterministic, no
sleeps): the share of batches each device takes and the throughput of two devices against one
follow from their service times. The group is checked through the real batcher, with the
per-instance counts it records, and its failover with sessions that lose their device.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.gauges import ModelGauges
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.serving import ModelFactory
from edgeagent.engine.settings import EngineSettings
from edgeagent.hardware.instances import InstanceGroup, Lane, plan_prior
from edgeagent.hardware.plan_search import MeasuredPlan, PlanShape
from edgeagent.hardware.profile import Candidate
from edgeagent.hardware.schedule import Instance, Scheduler, ServiceTime
from edgeagent.hardware.spread import device_key
from edgeagent.models.package import load_package
from edgeagent.runtimes.base import InferenceError, Session, TensorInfo
from tests.support.fixed_time import FixedTimeSession
from tests.support.helpers import write_tiny_package


class Still(Session):
    """A session the simulated-time tests never run."""

    runtime, device, precision = "fake", "SIM", "fp32"
    inputs: list[TensorInfo] = []
    outputs: list[TensorInfo] = []

    def run(self, feeds):  # pragma: no cover - never called
        raise AssertionError("simulated time only")


def simulate(services: list[float], batches: int, slots: int | None = None) -> tuple[list, float]:
    """A closed loop in simulated time: ``slots`` batches in flight (the batcher's concurrency,
    one per instance by default), each freed slot placing the next batch at once with the rest
    of the queue waiting behind it. Returns (batches per instance, simulated seconds)."""
    now = [0.0]
    scheduler = Scheduler(
        [Instance(Still(), f"D{i}") for i in range(len(services))], lambda: now[0]
    )
    index = {id(inst): i for i, inst in enumerate(scheduler.instances)}
    queues: list[list] = [[] for _ in services]
    events: list = []
    seq = itertools.count()
    left = [batches]

    def begin(ticket) -> None:
        scheduler.start(ticket, 1)
        service = services[index[id(ticket.instance)]]
        heapq.heappush(events, (now[0] + service, next(seq), ticket, service))

    def dispatch() -> None:
        left[0] -= 1
        ticket = scheduler.reserve(1, waiting=left[0])
        queue = queues[index[id(ticket.instance)]]
        queue.append(ticket)
        if len(queue) == 1:  # an instance runs one batch at a time
            begin(ticket)

    for _ in range(min(slots or len(services), batches)):
        dispatch()
    while events:
        now[0], _, ticket, service = heapq.heappop(events)
        scheduler.finish(ticket, service)
        queue = queues[index[id(ticket.instance)]]
        queue.pop(0)
        if queue:
            begin(queue[0])
        if left[0] > 0:
            dispatch()
    return [i.batches for i in scheduler.instances], now[0]


def test_two_equal_devices_share_evenly_and_double_the_throughput() -> None:
    counts, two = simulate([0.01, 0.01], 400)
    _, one = simulate([0.01], 400)
    assert counts == [200, 200]
    assert one / two >= 1.8  # the goal; simulated time, so exactly 2


def test_a_faster_device_takes_batches_in_proportion() -> None:
    """10 ms and 20 ms: the fast one takes 2/3, the two 1.5× one fast device alone."""
    counts, two = simulate([0.01, 0.02], 600)
    _, one = simulate([0.01], 600)
    assert counts[0] / sum(counts) == pytest.approx(2 / 3, abs=0.02)
    assert one / two == pytest.approx((1 / 0.01 + 1 / 0.02) / (1 / 0.01), abs=0.05)


def test_a_request_alone_on_an_idle_device_runs_on_the_session_of_all_the_cores() -> None:
    """The plan's 1-thread instances serve load; a lone request gets every core instead."""
    one, two = Instance(Still(), "CPU"), Instance(Still(), "CPU")
    wide = Instance(Still(), "CPU")
    scheduler = Scheduler([one, two], lone=wide)
    alone = scheduler.reserve(1)
    assert alone.instance is wide
    beside = scheduler.reserve(1)  # the lone session is busy: the next goes to an instance
    assert beside.instance in (one, two)
    scheduler.finish(alone, 0.002)
    assert scheduler.reserve(1).instance in (one, two)  # an instance still runs a batch
    scheduler.finish(beside, 0.004)
    assert scheduler.reserve(1, waiting=3).instance in (one, two)  # company is waiting
    assert scheduler.reserve(4).instance in (one, two)  # more than one row
    assert wide.batches == 1 and wide.times.estimate(1) == 0.002
    assert [i.batches for i in (one, two)].count(1) == 1


def test_a_lone_session_without_its_device_is_passed_over() -> None:
    class Gone(Still):
        candidate = None

        def status(self) -> dict:
            return {"active": None, "candidates": []}

        def set_power_mode(self, mode: str) -> None:
            pass

    only = Instance(Still(), "CPU")
    scheduler = Scheduler([only], lone=Instance(Gone(), "CPU"))
    assert scheduler.reserve(1).instance is only
    assert scheduler.reserve(1, exclude=[scheduler.lone]).instance is only


def test_a_much_slower_device_takes_a_lone_batch_only_when_it_finishes_sooner() -> None:
    now = [0.0]
    fast, slow = Instance(Still(), "FAST"), Instance(Still(), "SLOW")
    scheduler = Scheduler([fast, slow], lambda: now[0])
    fast.times.observe(1, 0.010)
    slow.times.observe(1, 0.025)
    first = scheduler.reserve(1)
    assert first.instance is fast  # idle and fast
    assert scheduler.reserve(1).instance is fast  # behind 10 ms there, done at 20 < 25 ms
    assert scheduler.reserve(1).instance is slow  # fast is busy enough: 30 > 25 ms
    scheduler.start(first, 1)
    now[0] = 0.008  # 2 ms left of the running one, 10 queued: 22 < 25 + 25 ms on slow
    assert scheduler.reserve(1).instance is fast


def test_requests_waiting_behind_a_batch_keep_an_idle_device_busy() -> None:
    """Under load (rows queued behind the batch), a busy fast instance is charged for them:
    it would serve them after this one, so the idle slow one takes this batch."""
    for waiting, expected in ((0, "FAST"), (4, "SLOW")):
        fast, slow = Instance(Still(), "FAST"), Instance(Still(), "SLOW")
        scheduler = Scheduler([fast, slow], lambda: 0.0)
        fast.times.observe(1, 0.010)
        slow.times.observe(1, 0.025)
        assert scheduler.reserve(1).instance is fast
        assert scheduler.reserve(1, waiting=waiting).instance.device == expected


def test_pacing_and_lost_devices_move_the_work() -> None:
    fast, slow = Instance(Still(), "FAST"), Instance(Still(), "SLOW")
    scheduler = Scheduler([fast, slow], lambda: 0.0)
    fast.times.observe(1, 0.010)
    slow.times.observe(1, 0.020)
    paced = scheduler.reserve(1, delay=lambda device: 1.0 if device == "FAST" else 0.0)
    assert paced.instance is slow  # the fast device's gate would hold it for a second
    scheduler.finish(paced, None)
    fast.session = Gone()  # its device is gone: it leaves the rotation
    assert scheduler.reserve(1).instance is slow
    slow.session = Gone()  # nothing works: still placed, so the session's error reaches the caller
    assert scheduler.reserve(1).instance in (fast, slow)


def test_only_an_idle_eligible_instance_is_reserved_at_once() -> None:
    """What a full queue overflows to: an eligible instance with nothing reserved, the fastest
    first; none while each is busy or out of the rotation."""
    slow, fast, local = (
        Instance(Still(), "peer:a"),
        Instance(Still(), "peer:b"),
        Instance(Still(), "D0"),
    )
    slow.times.observe(1, 0.5)
    fast.times.observe(1, 0.1)
    scheduler = Scheduler([local, slow, fast])
    remote = lambda instance: instance.device.startswith("peer:")  # noqa: E731
    first = scheduler.reserve_idle(1, remote)
    second = scheduler.reserve_idle(1, remote)
    assert first is not None and second is not None
    assert (first.instance, second.instance) == (fast, slow)
    assert scheduler.reserve_idle(1, remote) is None  # both busy; the local one is not eligible
    scheduler.finish(first, 0.1)
    assert scheduler.reserve_idle(1, remote) is not None


def test_service_time_estimates_from_what_was_measured() -> None:
    times = ServiceTime(prior={4: 0.04})
    assert times.estimate(8) == pytest.approx(0.08)  # the prior, scaled per row
    times.observe(1, 0.010)
    times.observe(1, 0.020)
    assert times.estimate(1) == pytest.approx(0.012)  # EWMA, newest weighted 0.2
    assert times.estimate(2) == pytest.approx(0.024)  # nearest measured size, per row
    assert ServiceTime().estimate(1) is None
    assert times.typical() == pytest.approx(0.012)


@pytest.mark.parametrize(
    ("candidate", "key"),
    [
        (Candidate("onnxruntime", "CPUExecutionProvider", "fp32"), "CPU"),
        (Candidate("openvino", "CPU", "int8"), "CPU"),
        (Candidate("onnxruntime", "CUDAExecutionProvider", "fp16"), "GPU0"),
        (
            Candidate("onnxruntime", "TensorrtExecutionProvider", "fp16", options={"device_id": 1}),
            "GPU1",
        ),
        (
            Candidate(
                "onnxruntime",
                "TensorrtExecutionProvider",
                "int8",
                options={"trt_dla_enable": True, "trt_dla_core": 1},
            ),
            "DLA1",
        ),
        (Candidate("litert", "EDGETPU", "int8", options={"device": "usb"}), "EDGETPU:usb"),
        (Candidate("openvino", "NPU", "fp16"), "NPU"),
    ],
)
def test_a_device_is_the_hardware_not_the_runtime(candidate: Candidate, key: str) -> None:
    assert device_key(candidate) == key


# -- the group through the real batcher ---------------------------------------------------


class Gone(FixedTimeSession):
    """A resilient session whose device is gone: no candidate, every run fails."""

    def __init__(self) -> None:
        super().__init__("GONE", 0.0)

    candidate = None

    def set_power_mode(self, mode: str) -> None:
        pass

    def status(self) -> dict:
        return {"active": None, "candidates": []}

    def run(self, feeds):
        raise InferenceError("no working accelerator for tiny (GONE: 3 consecutive run errors)")


def plan(instances: int = 1) -> MeasuredPlan:
    return MeasuredPlan(PlanShape(instances, 1, 1), "fixed", 1)


def two_devices(fast: Session, slow: Session) -> InstanceGroup:
    return InstanceGroup([fast], plan(), [Lane("SLOW", plan(), [slow])])


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


def build(tmp_path: Path, executor, group: InstanceGroup, metrics: EngineMetrics | None = None):
    package = load_package(write_tiny_package(tmp_path / "pkg"))
    factory = ModelFactory(
        EngineSettings(max_batch_size=1),
        executor=executor,
        metrics=metrics or EngineMetrics(CollectorRegistry()),
        load=LoadCounter(),
    )
    return factory.build(package, group)


async def test_the_batcher_runs_every_instance_and_favours_the_fast_one(tmp_path, executor):
    fast, slow = FixedTimeSession("FAST", 0.01), FixedTimeSession("SLOW", 0.03)
    group = two_devices(fast, slow)
    model = build(tmp_path, executor, group)
    assert model.plan.instances == 2  # the batcher's concurrency: every lane's instances
    feeds = [{"input": np.full((1, 3, 8, 8), i, np.float32)} for i in range(48)]

    async def client(mine: list) -> list:  # closed loop: the next request when one is answered
        return [await model.infer(f) for f in mine]

    answers = await asyncio.gather(*(client(feeds[i::16]) for i in range(16)))
    for i in range(16):  # each request its own rows, whichever device ran it
        assert [a["logits"][0, 0] for a in answers[i]] == [
            f["input"][0, 0, 0, 0] for f in feeds[i::16]
        ]
    counts = [f["batches"] for f in group.scheduler.figures()]
    assert counts == [fast.batches, slow.batches] and sum(counts) == 48
    assert slow.batches >= 1 and fast.batches > 1.5 * slow.batches  # 3:1 by service time
    assert fast.max_inside == slow.max_inside == 1  # no instance entered twice
    await model.close(5)


async def test_a_batch_on_a_lost_device_is_answered_by_another(tmp_path, executor):
    fast = FixedTimeSession("FAST", 0.0)
    group = InstanceGroup([Gone()], plan(), [Lane("FAST", plan(), [fast])])
    model = build(tmp_path, executor, group)
    x = np.full((1, 3, 8, 8), 7, np.float32)
    answers = await asyncio.gather(*(model.infer({"input": x}) for _ in range(6)))
    assert all(a["logits"][0, 0] == 7 for a in answers)  # none lost
    assert fast.batches == 6
    await model.close(5)


async def test_a_fault_of_the_batch_itself_is_not_retried_elsewhere(tmp_path, executor):
    class Faulty(FixedTimeSession):
        candidate = Candidate("fake", "FAULTY", "fp32")  # its device still works

        def run(self, feeds):
            self.batches += 1
            raise InferenceError("bad input for this model")

    faulty, other = Faulty("FAULTY", 0.0), FixedTimeSession("OTHER", 0.0)
    group = InstanceGroup([faulty], plan(), [Lane("OTHER", plan(), [other])])
    with pytest.raises(InferenceError, match="bad input"):
        group.run({"input": np.zeros((1, 3, 8, 8), np.float32)})
    assert (faulty.batches, other.batches) == (1, 0)


async def test_status_and_metrics_show_each_instance(tmp_path, executor):
    fast, slow = FixedTimeSession("FAST", 0.0), FixedTimeSession("SLOW", 0.0)
    group = two_devices(fast, slow)
    prom = CollectorRegistry()
    metrics = EngineMetrics(prom)
    model = build(tmp_path, executor, group, metrics)
    gauges = ModelGauges(metrics)
    gauges.on_load(model)
    x = np.zeros((1, 3, 8, 8), np.float32)
    for _ in range(4):
        await model.infer({"input": x})
    status = group.status()
    shown = status["instances"]
    assert [s["device"] for s in shown] == ["FAST", "SLOW"]
    assert sum(s["batches"] for s in shown) == 4 and sum(s["share"] for s in shown) == 1
    assert all(s["plan"] == "1x1:b1" for s in shown) and shown[0]["ewma_ms"]
    assert [lane["device"] for lane in status["spread"]] == ["FAST", "SLOW"]
    labels = {"model": "tiny", "version": model.version, "instance": "0", "device": "FAST"}
    batches = prom.get_sample_value("edgeagent_execution_instance", {**labels, "field": "batches"})
    assert batches == shown[0]["batches"]
    gauges.on_unload(model)
    assert (
        prom.get_sample_value("edgeagent_execution_instance", {**labels, "field": "batches"})
        is None
    )
    await model.close(5)


def test_an_instance_starts_from_its_split_s_figures_in_the_plan_search() -> None:
    """Seconds per batch of one instance: rows × instances ÷ the split's rows/s, by batch."""
    figures = {"2x1:b1": 400.0, "2x1:b4": 800.0, "1x2:b1": 300.0, "2x1:b8": 0.0}
    plan = MeasuredPlan(PlanShape(2, 1, 4), "search", 2, figures)
    assert plan_prior(plan) == {1: 2 / 400.0, 4: 8 / 800.0}
