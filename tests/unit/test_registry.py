"""ModelRegistry through its public interface, with real onnxruntime sessions of tiny models."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from devtools.package import set_fields
from devtools.waiting import until
from edgeagent.engine.errors import LoadFailed, ModelNotFound, NotReady
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.registry import ModelRegistry
from edgeagent.engine.settings import EngineSettings
from edgeagent.models.session import open_variant
from tests.support.helpers import serving_registry, write_tiny_package


class Opened:
    """Records the sessions the registry opened and closed."""

    def __init__(self) -> None:
        self.sessions: list = []
        self.closed: list = []

    def __call__(self, package):
        session = open_variant(package)
        release = session.close

        def close() -> None:
            self.closed.append(session)
            release()

        session.close = close
        self.sessions.append(session)
        return session


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


def make_registry(
    executor, opener=open_variant, **settings
) -> tuple[ModelRegistry, CollectorRegistry]:
    prom = CollectorRegistry()
    registry = serving_registry(
        opener, settings=EngineSettings(**settings), metrics=EngineMetrics(prom), executor=executor
    )
    return registry, prom


def frames(count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(count)]


async def test_load_get_index_and_unknown(tmp_path: Path, executor):
    registry, prom = make_registry(executor)
    registry.add(write_tiny_package(tmp_path / "a", name="alpha"))
    registry.add(write_tiny_package(tmp_path / "b", name="beta", version="2.1.0"))
    with pytest.raises(NotReady, match="alpha"):
        registry.get("alpha")
    await registry.load_all()
    try:
        assert registry.index() == [
            {"name": "alpha", "version": "1", "state": "READY", "reason": ""},
            {"name": "beta", "version": "2.1.0", "state": "READY", "reason": ""},
        ]
        model = registry.get("beta", "2.1.0")
        assert model.version == "2.1.0" and model.backend["runtime"] == "onnxruntime"
        answer = await model.infer({"input": frames(1)[0]})
        assert answer["logits"].shape == (1, 4)
        with pytest.raises(ModelNotFound, match="gamma"):
            registry.get("gamma")
        with pytest.raises(ModelNotFound, match="no version '7'"):
            registry.get("alpha", "7")
        text = generate_latest(prom).decode()
        assert 'edgeagent_model_loaded{device="CPUExecutionProvider",model="beta"' in text
    finally:
        await registry.close()
    assert registry.index()[0]["state"] == "UNAVAILABLE"


async def test_invalid_package_is_listed_with_its_reason(tmp_path: Path, executor):
    registry, _ = make_registry(executor)
    broken = write_tiny_package(tmp_path / "broken", name="broken")
    set_fields(broken, {"inputs.0.dtype": "float99"})
    registry.add(broken)
    await registry.load_all()
    [row] = registry.index()
    assert row["state"] == "UNAVAILABLE" and "inputs[0].dtype" in row["reason"]
    with pytest.raises(NotReady, match=r"inputs\[0\]\.dtype"):
        registry.get("broken")


async def test_unload_then_load_again(tmp_path: Path, executor):
    opened = Opened()
    registry, _ = make_registry(executor, opened)
    registry.add(write_tiny_package(tmp_path / "t"))
    await registry.load("tiny")
    await registry.unload("tiny")
    assert opened.closed == [opened.sessions[0]]
    assert registry.index() == [
        {"name": "tiny", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    with pytest.raises(NotReady, match="unloaded"):
        registry.get("tiny")
    model = await registry.load("tiny")
    assert (await model.infer({"input": frames(1)[0]}))["logits"].shape == (1, 4)
    await registry.close()


async def test_hot_swap_under_load_fails_no_request(tmp_path: Path, executor):
    """Requests keep flowing while version 2 replaces version 1; every one is answered."""
    opened = Opened()
    registry, _ = make_registry(executor, opened, max_queue=1000)
    v1 = write_tiny_package(tmp_path / "v1", version="1", seed=1)
    v2 = write_tiny_package(tmp_path / "v2", version="2", seed=2)
    registry.add(v1)
    await registry.load("tiny")
    inputs = frames(8)
    stop = asyncio.Event()
    answered: list[str] = []

    async def client(x: np.ndarray) -> None:
        while not stop.is_set():
            model = registry.get("tiny")
            await asyncio.sleep(0)  # the swap may happen between lookup and infer
            out = await model.infer({"input": x})
            assert out["logits"].shape == (1, 4)
            answered.append(model.version)

    clients = [asyncio.create_task(client(x)) for x in inputs]
    await until(lambda: "1" in answered)
    new = await registry.activate(v2)
    await until(lambda: answered.count("2") >= len(inputs))
    stop.set()
    await asyncio.gather(*clients)  # re-raises any failed request
    assert new.version == "2" and registry.get("tiny") is new
    assert registry.versions("tiny") == ["2"]
    assert "1" in answered and "2" in answered
    assert opened.closed == [opened.sessions[0]]  # the old session closed after draining
    # the new version really answers with its own weights
    direct = opened.sessions[1].run({"input": inputs[0]})["logits"]
    np.testing.assert_allclose((await new.infer({"input": inputs[0]}))["logits"], direct)
    await registry.close()


async def test_failed_activation_keeps_old_version(tmp_path: Path, executor):
    registry, _ = make_registry(executor)
    registry.add(write_tiny_package(tmp_path / "v1"))
    old = await registry.load("tiny")
    bad = write_tiny_package(tmp_path / "v2", version="2")
    (bad / "tiny.fp32.onnx").write_bytes(b"not an onnx file at all")
    bad_toml = (bad / "model.toml").read_text()
    (bad / "model.toml").write_text(bad_toml.split("sha256")[0])  # hash check off: load fails
    with pytest.raises(LoadFailed, match="version 2"):
        await registry.activate(bad)
    assert registry.get("tiny") is old and registry.versions("tiny") == ["1"]
    assert (await old.infer({"input": frames(1)[0]}))["logits"].shape == (1, 4)
    await registry.close()


async def test_keep_previous_version_addressable(tmp_path: Path, executor):
    registry, _ = make_registry(executor)
    registry.add(write_tiny_package(tmp_path / "v1", seed=1))
    await registry.load("tiny")
    await registry.activate(
        write_tiny_package(tmp_path / "v2", version="2", seed=2), keep_previous=True
    )
    assert registry.versions("tiny") == ["1", "2"]
    assert registry.get("tiny").version == "2"
    x = frames(1)[0]
    one = await registry.get("tiny", "1").infer({"input": x})
    two = await registry.get("tiny", "2").infer({"input": x})
    assert not np.allclose(one["logits"], two["logits"])
    assert [r["version"] for r in registry.index()] == ["1", "2"]
    await registry.close()


async def test_statistics_follow_the_v2_extension(tmp_path: Path, executor):
    registry, _ = make_registry(executor)
    registry.add(write_tiny_package(tmp_path / "t"))
    model = await registry.load("tiny")
    await asyncio.gather(*(model.infer({"input": x}) for x in frames(6)))
    stats = model.stats.to_v2(model.name, model.version)
    assert stats["name"] == "tiny" and stats["version"] == "1"
    assert stats["inference_count"] == 6
    assert stats["inference_stats"]["success"]["count"] == 6
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert 1 <= stats["execution_count"] <= 6
    assert (
        sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == stats["execution_count"]
    )
    assert stats["last_inference"] > 0
    await registry.close()


async def test_result_cache_hits_and_misses(tmp_path: Path, executor):
    registry, prom = make_registry(executor, cache_size=2)
    registry.add(write_tiny_package(tmp_path / "t"))
    model = await registry.load("tiny")
    a, b, c = frames(3)
    first = await model.infer({"input": a})
    again = await model.infer({"input": a.copy()})
    np.testing.assert_array_equal(first["logits"], again["logits"])
    assert not again["logits"].flags.writeable
    await model.infer({"input": b})
    await model.infer({"input": c})  # evicts a (capacity 2)
    await model.infer({"input": a})
    hits = prom.get_sample_value("edgeagent_cache_hits_total", {"model": "tiny"})
    misses = prom.get_sample_value("edgeagent_cache_misses_total", {"model": "tiny"})
    assert (hits, misses) == (1, 4)
    stats = model.stats.to_v2("tiny", "1")["inference_stats"]
    assert stats["cache_hit"]["count"] == 1 and stats["cache_miss"]["count"] == 4
    await registry.close()
