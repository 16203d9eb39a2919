"""The batcher: answers belong to their requests, validation, back-pressure, governor limits."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from devtools.package import set_fields
from devtools.waiting import until
from edgeagent.engine.batcher import Batcher, BatchPolicy
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.errors import (
    DeadlineExceeded,
    InvalidInput,
    NotReady,
    QueueFull,
    ServingError,
    Throttled,
)
from edgeagent.engine.gate import DeviceGate
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.stats import ModelStats
from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from tests.support.helpers import write_tiny_package


class Overlap:
    """Counts sessions running at once (one per model, or shared across models)."""

    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)

    def __exit__(self, *exc) -> None:
        with self._lock:
            self.active -= 1


class Recording:
    """A real session wrapped to record batch sizes, overlap and power-mode calls."""

    def __init__(self, session, fail_when_rows: int | None = None, overlap=None) -> None:
        self.inner = session
        self.runtime, self.device, self.precision = "onnxruntime", session.device, "fp32"
        self.rows: list[int] = []
        self.modes: list[str] = []
        self.fail_when_rows = fail_when_rows
        self.overlap = overlap or Overlap()

    def run(self, feeds):
        rows = next(iter(feeds.values())).shape[0]
        with self.overlap:
            self.rows.append(rows)
            if rows == self.fail_when_rows:
                raise RuntimeError("device lost")
            time.sleep(0.002)
            return self.inner.run(feeds)

    # the ManagedSession extensions, as ResilientSession has them
    candidate = None  # no profile candidate: the backend is the session's own

    def set_power_mode(self, mode: str) -> None:
        self.modes.append(mode)

    def status(self) -> dict:
        return {"modes": self.modes}


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


@pytest.fixture
def package(tmp_path: Path):
    return load_package(write_tiny_package(tmp_path / "tiny"))


def make_batcher(
    package, executor, *, session=None, limits=lambda: UNTHROTTLED, gate=None, load=None, **policy
):
    values = dict(
        max_batch_size=8, max_queue_delay_s=0.02, max_queue=64, timeout_s=10.0, default_priority=2
    )
    values.update(policy)
    session = session or open_variant(package)
    return Batcher(
        package.name,
        package.version,
        session,
        package.inputs,
        package.outputs,
        BatchPolicy(**values),
        executor=executor,
        gate=gate or DeviceGate(),
        limits=limits,
        metrics=EngineMetrics(CollectorRegistry()),
        stats=ModelStats(),
        load=load or LoadCounter(),
    )


def distinct_inputs(count: int) -> list[np.ndarray]:
    """Inputs of 1 to 3 rows, every row different, so a mix-up cannot go unnoticed."""
    rng = np.random.default_rng(42)
    return [rng.standard_normal((1 + i % 3, 3, 8, 8)).astype(np.float32) for i in range(count)]


async def test_each_answer_belongs_to_its_request(package, executor):
    direct = open_variant(package)
    session = Recording(open_variant(package))
    batcher = make_batcher(package, executor, session=session)
    inputs = distinct_inputs(60)
    answers = await asyncio.gather(*(batcher.submit({"input": x}) for x in inputs))
    for x, answer in zip(inputs, answers, strict=True):
        expected = direct.run({"input": x})["logits"]
        assert answer["logits"].shape == expected.shape
        np.testing.assert_allclose(answer["logits"], expected, rtol=1e-5, atol=1e-6)
    assert max(session.rows) > 3, "requests were never merged: the test proves nothing"
    assert max(session.rows) <= 8 and sum(session.rows) == sum(len(x) for x in inputs)
    assert session.overlap.max_active == 1  # one batch at a time per session
    await batcher.close(1.0)


async def test_adaptive_wait_spares_a_lone_client(package, executor):
    """With a long queue delay, a lone request runs at once; a crowd still gets merged."""
    session = Recording(open_variant(package))
    batcher = make_batcher(package, executor, session=session, max_queue_delay_s=1.0)
    x = distinct_inputs(1)[0]
    started = time.monotonic()
    for _ in range(3):
        await batcher.submit({"input": x})
    assert time.monotonic() - started < 1.0  # not one full queue delay for three requests
    await asyncio.gather(*(batcher.submit({"input": x}) for _ in range(12)))
    assert session.rows[:3] == [1, 1, 1] and max(session.rows) > 1
    await batcher.close(1.0)


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({}, "input 'input' is missing"),
        ({"input": np.zeros((1, 3, 8, 8), np.float32), "extra": np.zeros(1)}, "no input 'extra'"),
        ({"input": np.zeros((1, 3, 8, 8), np.float64)}, "'input': datatype is float64"),
        ({"input": np.zeros((1, 3, 8), np.float32)}, "'input': shape .* has 3 dimensions"),
        ({"input": np.zeros((1, 3, 8, 9), np.float32)}, "dimension 3 is 9, expected 8"),
        ({"input": np.zeros((0, 3, 8, 8), np.float32)}, "holds no elements"),
        ({"input": np.zeros((9, 3, 8, 8), np.float32)}, "9 rows exceeds its max_batch_size 8"),
        ({"input": [[1.0]]}, "expected an array"),
    ],
)
async def test_invalid_input_names_the_tensor(package, executor, feeds, message):
    batcher = make_batcher(package, executor)
    with pytest.raises(InvalidInput, match=message) as caught:
        await batcher.submit(feeds)
    assert caught.value.status == 400
    ok = await batcher.submit({"input": np.zeros((1, 3, 8, 8), np.float32)})
    assert ok["logits"].shape == (1, 4)  # the bad request did not disturb the batcher
    await batcher.close(1.0)


async def test_queue_full_then_queued_requests_still_answered(package, executor):
    batcher = make_batcher(package, executor, max_queue=2, max_queue_delay_s=0.3, adaptive=False)
    x = np.zeros((1, 3, 8, 8), np.float32)
    waiting = [asyncio.create_task(batcher.submit({"input": x})) for _ in range(2)]
    await until(lambda: batcher.queued == 2)
    with pytest.raises(QueueFull, match="max_queue = 2") as caught:
        await batcher.submit({"input": x})
    assert caught.value.status == 429 and caught.value.retry_after
    assert all(a["logits"].shape == (1, 4) for a in await asyncio.gather(*waiting))
    await batcher.close(1.0)


async def test_deadline_exceeded_is_504_and_batcher_recovers(package, executor):
    batcher = make_batcher(package, executor, max_queue_delay_s=0.5, adaptive=False)
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(DeadlineExceeded, match="within 0.05 s") as caught:
        await batcher.submit({"input": x}, timeout_s=0.05)
    assert caught.value.status == 504
    assert (await batcher.submit({"input": x}, timeout_s=5))["logits"].shape == (1, 4)
    await batcher.close(1.0)


async def test_governor_sheds_low_priority_with_retry_after(package, executor):
    limits = ServingLimits(shed_priority_from=2, retry_after_s=7, reason="hot: cpu 91 °C")
    batcher = make_batcher(package, executor, limits=lambda: limits)
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(Throttled, match="hot: cpu 91 °C") as caught:
        await batcher.submit({"input": x})  # no priority = default 2
    assert (caught.value.status, caught.value.retry_after) == (503, 7)
    assert (await batcher.submit({"input": x}, priority=1))["logits"].shape == (1, 4)
    await batcher.close(1.0)


async def test_governor_caps_batch_size_and_switches_power_mode(package, executor):
    current = [ServingLimits(max_batch_size=2, prefer_low_power=True)]
    session = Recording(open_variant(package))
    batcher = make_batcher(package, executor, session=session, limits=lambda: current[0])
    inputs = [x[:1] for x in distinct_inputs(12)]
    await asyncio.gather(*(batcher.submit({"input": x}) for x in inputs))
    assert max(session.rows) == 2 and session.modes == ["low"]
    current[0] = UNTHROTTLED
    await asyncio.gather(*(batcher.submit({"input": x}) for x in inputs))
    assert session.modes == ["low", "high"] and max(session.rows) > 2
    await batcher.close(1.0)


class BatchLog(LoadCounter):
    """The engine's load counter, keeping each batch's busy seconds as well."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[float] = []

    def record_batch(self, busy_s: float) -> None:
        super().record_batch(busy_s)
        self.batches.append(busy_s)


async def test_pacing_and_concurrency_across_models(package, executor):
    duty = 0.25
    limits = ServingLimits(max_concurrency=1, duty_cycle=duty)
    gate = DeviceGate()
    overlap = Overlap()
    log = BatchLog()
    sessions = [Recording(open_variant(package), overlap=overlap) for _ in range(2)]
    batchers = [
        make_batcher(
            package,
            executor,
            session=s,
            gate=gate,
            limits=lambda: limits,
            max_batch_size=1,
            load=log,
        )
        for s in sessions
    ]
    x = np.zeros((1, 3, 8, 8), np.float32)
    started = time.monotonic()
    await asyncio.gather(*(b.submit({"input": x}) for b in batchers for _ in range(3)))
    elapsed = time.monotonic() - started
    # each batch earns a rest of its own busy time: the five before the last one took at least
    # their busy time / duty between them (a lower bound, whatever the machine's speed)
    assert len(log.batches) == 6
    assert elapsed >= (sum(log.batches) - max(log.batches)) / duty
    assert overlap.max_active == 1  # never two batches at once, across both models
    assert gate.running == 0
    for batcher in batchers:
        await batcher.close(1.0)


async def test_model_that_cannot_batch_runs_one_at_a_time(tmp_path: Path, executor):
    root = write_tiny_package(tmp_path / "fixed")
    set_fields(root, {"inputs.0.shape": [1, 3, 8, 8], "outputs.0.shape": [1, 4]})
    package = load_package(root)
    session = Recording(open_variant(package))
    batcher = make_batcher(package, executor, session=session)
    assert not batcher.batching
    inputs = [x[:1] for x in distinct_inputs(6)]
    answers = await asyncio.gather(*(batcher.submit({"input": x}) for x in inputs))
    assert session.rows == [1] * 6 and all(a["logits"].shape == (1, 4) for a in answers)
    with pytest.raises(InvalidInput, match="dimension 0 is 2, expected 1"):
        await batcher.submit({"input": distinct_inputs(2)[1]})
    await batcher.close(1.0)


async def test_failed_batch_fails_its_requests_only(package, executor):
    session = Recording(open_variant(package), fail_when_rows=3)
    batcher = make_batcher(package, executor, session=session, max_queue_delay_s=0)
    with pytest.raises(ServingError, match="device lost") as caught:
        await batcher.submit({"input": distinct_inputs(3)[2]})
    assert caught.value.status == 500
    assert (await batcher.submit({"input": distinct_inputs(1)[0]}))["logits"].shape == (1, 4)
    await batcher.close(1.0)


async def test_close_drains_queued_requests_and_refuses_new(package, executor):
    batcher = make_batcher(package, executor, max_queue_delay_s=0.2)
    inputs = distinct_inputs(10)
    pending = [asyncio.create_task(batcher.submit({"input": x})) for x in inputs]
    await asyncio.sleep(0)  # submit queues before its first await: one turn queues them all
    assert batcher.queued == len(inputs)
    await batcher.close(5.0)
    assert all(task.done() and not task.exception() for task in pending)
    with pytest.raises(NotReady, match="shutting down"):
        await batcher.submit({"input": inputs[0]})


async def test_close_time_out_fails_what_cannot_run(package, executor):
    limits = ServingLimits(duty_cycle=0.004)  # each batch (>= 2 ms) earns >= 0.5 s of rest
    session = Recording(open_variant(package))
    batcher = make_batcher(
        package, executor, session=session, limits=lambda: limits, max_batch_size=1
    )
    pending = [asyncio.create_task(batcher.submit({"input": x[:1]})) for x in distinct_inputs(4)]
    await asyncio.sleep(0)  # one turn of the loop queues them all (see above)
    assert batcher.queued == len(pending)
    await batcher.close(0.1)
    outcomes = await asyncio.gather(*pending, return_exceptions=True)
    assert any(isinstance(o, NotReady) for o in outcomes)
    assert all(isinstance(o, (dict, NotReady)) for o in outcomes)


async def test_relaxed_pacing_takes_effect_at_once(package, executor):
    current = [ServingLimits(duty_cycle=1e-5)]  # a batch (>= 2 ms) earns minutes of rest
    session = Recording(open_variant(package))
    batcher = make_batcher(package, executor, session=session, limits=lambda: current[0])
    x = distinct_inputs(1)[0]
    await batcher.submit({"input": x})  # the first batch starts at once
    waiting = asyncio.create_task(batcher.submit({"input": x}))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # paced: the next start is minutes away
    current[0] = UNTHROTTLED
    assert (await asyncio.wait_for(waiting, 5))["logits"].shape == (1, 4)
    await batcher.close(1.0)


async def test_urgent_requests_overtake_queued_ones(package, executor):
    limits = ServingLimits(duty_cycle=0.05)  # one batch at a time, queue builds up
    session = Recording(open_variant(package))
    batcher = make_batcher(
        package, executor, session=session, limits=lambda: limits, max_batch_size=1
    )
    order: list[str] = []

    async def submit(tag: str, priority: int) -> None:
        await batcher.submit({"input": distinct_inputs(1)[0]}, priority=priority)
        order.append(tag)

    tasks = [asyncio.create_task(submit(f"low{i}", 3)) for i in range(4)]
    await until(lambda: batcher.queued + len(session.rows) == 4)  # every low one is in
    tasks.append(asyncio.create_task(submit("urgent", 1)))
    await asyncio.gather(*tasks)
    assert order.index("urgent") <= 1, order  # at most the batch already started ran first
    await batcher.close(1.0)


async def test_batcher_counts_each_batch_for_the_governor(package, executor):
    counter = LoadCounter()
    batcher = make_batcher(package, executor, load=counter, max_batch_size=1)
    for x in distinct_inputs(3):
        await batcher.submit({"input": x[:1]})
    await batcher.close(1.0)
    busy, batches = counter.totals()
    assert batches == 3 and busy > 0


async def test_a_batch_loop_that_dies_is_logged_with_its_traceback(package, executor, caplog):
    class BrokenGate(DeviceGate):
        async def acquire(self, limits, device: str = "") -> None:
            raise RuntimeError("the device gate broke")

    batcher = make_batcher(package, executor, gate=BrokenGate(), timeout_s=0.5)
    request = asyncio.ensure_future(batcher.submit({"input": distinct_inputs(1)[0]}))
    await until(lambda: "background task batch:tiny died" in caplog.text)
    [record] = [r for r in caplog.records if r.getMessage() == "background task batch:tiny died"]
    assert record.levelname == "ERROR" and record.exc_info is not None
    assert "the device gate broke" in caplog.text
    request.cancel()
