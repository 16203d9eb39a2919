"""The HTTP API over a real Unix socket: v2 routes, classify, status, metrics, compression."""

from __future__ import annotations

import gzip
import io
import json
import threading
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import numpy as np
import psutil
import pytest
from PIL import Image

from edgeagent.api import v2
from edgeagent.api.http.app_keys import JSON_HELPER
from edgeagent.api.http.v2_routes import OFFLOAD_JSON_BYTES
from tests.support.http_agent import (
    AgentServer,
    direct_run,
    tcp_session,
    tiny_agent,
    unix_session,
)

H = v2.HEADER_LENGTH


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with tiny_agent(tmp_path_factory.mktemp("api")) as server:
        yield server


@pytest.fixture
async def http(agent: AgentServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with unix_session(agent) as session:
        yield session


@pytest.fixture(scope="module")
def reference(agent: AgentServer) -> Iterator:
    with direct_run(agent.packages[0]) as run:
        yield run


def _batch(rows: int = 1, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 3, 8, 8), dtype=np.float32)


async def test_health_is_exactly_200_with_an_empty_body(http: aiohttp.ClientSession) -> None:
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/tiny/ready"):
        async with http.get(path) as response:
            assert response.status == 200
            assert await response.read() == b""


async def test_json_infer_matches_a_direct_run(http: aiohttp.ClientSession, reference) -> None:
    batch = _batch(2, seed=3)
    body = {
        "id": "json-1",
        "parameters": {"trace_id": 9, "priority": 0, "whatever": [1, 2]},  # unknown ones ignored
        "inputs": [
            {"name": "input", "shape": [2, 3, 8, 8], "datatype": "FP32", "data": batch.tolist()}
        ],
    }
    async with http.post("/v2/models/tiny/infer", json=body) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "application/json"
        answer = await response.json()
    assert answer["id"] == "json-1"
    assert (answer["model_name"], answer["model_version"]) == ("tiny", "1")
    (output,) = answer["outputs"]
    assert output["name"] == "logits" and output["shape"] == [2, 4]
    expected = reference(batch)
    np.testing.assert_allclose(np.array(output["data"]).reshape(2, 4), expected, rtol=1e-5)


async def test_large_json_request_is_answered(
    agent: AgentServer, http: aiohttp.ClientSession, reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JSON part over OFFLOAD_JSON_BYTES is parsed in the JSON helper process, never in the
    daemon, with the same result (a small one is parsed on the loop); a body the helper does
    not take is parsed on the app's one JSON thread (the daemon's own 400), and a helper that
    died is replaced."""
    calls: list[tuple[str, str]] = []
    for name in ("decode_request", "decode_message", "parse_json_object"):
        monkeypatch.setattr(v2, name, _recording(getattr(v2, name), name, calls))
    batch = _batch(1, seed=9)
    body = {
        "parameters": {"note": "x" * (OFFLOAD_JSON_BYTES + 1)},
        "inputs": [
            {"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": batch.tolist()}
        ],
    }
    helper = agent.app[JSON_HELPER]

    async def answered(sent: dict) -> None:
        async with http.post("/v2/models/tiny/infer", json=sent) as response:
            assert response.status == 200, await response.text()
            output = (await response.json())["outputs"][0]["data"]
        np.testing.assert_allclose(np.array(output).reshape(1, 4), reference(batch), rtol=1e-5)

    await answered(body)
    started = helper.pid
    assert started is not None
    assert "edgeagent.api.jsonparse.helper_process" in psutil.Process(started).cmdline()
    assert [name for name, _ in calls] == ["decode_message"]  # parsed by the helper
    calls.clear()
    await answered({"inputs": [{**body["inputs"][0]}]})  # type: ignore[index]
    assert [name for name, _ in calls] == ["decode_request", "parse_json_object", "decode_message"]
    assert not any(thread.startswith("edgeagent-json") for _, thread in calls)  # on the loop
    psutil.Process(started).kill()
    psutil.Process(started).wait(5)
    await answered(body)  # the exit is seen first: a new helper takes it
    assert helper.pid not in (None, started)
    calls.clear()
    broken = json.dumps(body).encode()[:-2]
    async with http.post("/v2/models/tiny/infer", data=broken) as response:
        assert response.status == 400
        assert "not valid JSON" in (await response.json())["error"]
    assert calls and all(thread.startswith("edgeagent-json_") for _, thread in calls), calls


def _recording(function: Any, name: str, calls: list[tuple[str, str]]) -> Any:
    def recording(*args: Any) -> Any:
        calls.append((name, threading.current_thread().name))
        return function(*args)

    return recording


async def test_binary_infer_on_the_versioned_route(http: aiohttp.ClientSession, reference) -> None:
    batch = _batch(3, seed=4)
    body, length = v2.encode_request({"input": batch}, binary=True, request_id="b")
    async with http.post(
        "/v2/models/tiny/versions/1/infer", data=body, headers={H: str(length)}
    ) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "application/octet-stream"
        decoded = v2.decode_response(await response.read(), response.headers[H])
    assert decoded.id == "b"
    np.testing.assert_allclose(decoded.outputs["logits"], reference(batch), rtol=1e-5)


async def test_per_output_binary_overrides_the_request_default(
    http: aiohttp.ClientSession,
) -> None:
    batch = _batch(1, seed=5)
    body, length = v2.encode_request({"input": batch}, binary=True)
    message = json.loads(body[:length])
    message["outputs"] = [{"name": "logits", "parameters": {"binary_data": False}}]
    head = json.dumps(message).encode()
    async with http.post(
        "/v2/models/tiny/infer", data=head + body[length:], headers={H: str(len(head))}
    ) as response:
        assert response.status == 200, await response.text()
        assert H not in response.headers
        assert len((await response.json())["outputs"][0]["data"]) == 4


async def test_raw_body_with_header_length_zero(http: aiohttp.ClientSession, reference) -> None:
    batch = _batch(1, seed=6)
    async with http.post(
        "/v2/models/tiny/infer", data=batch.tobytes(), headers={H: "0"}
    ) as response:
        assert response.status == 200, await response.text()
        decoded = v2.decode_response(await response.read(), response.headers[H])
    np.testing.assert_allclose(decoded.outputs["logits"], reference(batch), rtol=1e-5)


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
async def test_compressed_request_and_response_over_tcp(
    agent: AgentServer, reference, encoding, compress
) -> None:
    batch = _batch(2, seed=7)
    body, length = v2.encode_request({"input": batch}, binary=True)
    headers = {H: str(length), "Content-Encoding": encoding, "Accept-Encoding": encoding}
    async with (
        tcp_session(agent) as http,
        http.post("/v2/models/tiny/infer", data=compress(body), headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        assert response.headers["Content-Encoding"] == encoding
        # the client undid the Content-Encoding; the header still counts uncompressed bytes
        decoded = v2.decode_response(await response.read(), response.headers[H])
    np.testing.assert_allclose(decoded.outputs["logits"], reference(batch), rtol=1e-5)


async def test_unix_socket_takes_compressed_requests_but_answers_plain(
    http: aiohttp.ClientSession, reference
) -> None:
    batch = _batch(1, seed=8)
    body, length = v2.encode_request({"input": batch}, binary=True)
    headers = {H: str(length), "Content-Encoding": "gzip", "Accept-Encoding": "gzip"}
    async with http.post("/v2/models/tiny/infer", data=gzip.compress(body), headers=headers) as r:
        assert r.status == 200
        assert "Content-Encoding" not in r.headers
        decoded = v2.decode_response(await r.read(), r.headers[H])
    np.testing.assert_allclose(decoded.outputs["logits"], reference(batch), rtol=1e-5)


async def test_metadata_config_and_stats(http: aiohttp.ClientSession) -> None:
    async with http.get("/v2") as response:
        assert "binary_tensor_data" in (await response.json())["extensions"]
    async with http.get("/v2/models/tiny/versions/1") as response:
        meta = await response.json()
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 4]}]
    async with http.get("/v2/models/tiny/versions/1/config") as response:
        assert (await response.json())["backend"] == "onnxruntime"
    async with http.get("/v2/models/tiny/versions/1/stats") as response:
        (stats,) = (await response.json())["model_stats"]
    assert stats["version"] == "1" and set(stats["inference_stats"]) >= {"success", "queue"}
    async with http.get("/v2/models/stats") as response:
        assert [s["name"] for s in (await response.json())["model_stats"]] == ["tiny"]


async def test_repository_index_accepts_empty_and_filtered_bodies(
    http: aiohttp.ClientSession,
) -> None:
    async with http.post("/v2/repository/index") as response:
        assert response.status == 200
        assert await response.json() == [
            {"name": "tiny", "version": "1", "state": "READY", "reason": ""}
        ]
    async with http.post("/v2/repository/index", json={"ready": True}) as response:
        assert len(await response.json()) == 1
    async with http.post("/v2/repository/index", data=b"[1]") as response:
        assert response.status == 400


def _image(fmt: str, color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
async def test_classify_an_image(http: aiohttp.ClientSession, fmt: str) -> None:
    async with http.post("/v1/models/tiny/classify?top_k=3", data=_image(fmt, (200, 30, 90))) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert len(answer["labels"]) == len(answer["scores"]) == 3
    assert all(label.startswith("class_") for label in answer["labels"])
    assert answer["scores"] == sorted(answer["scores"], reverse=True)
    assert 0 < sum(answer["scores"]) <= 1.0 + 1e-6
    assert answer["model_version"] == "1"
    assert (answer["backend"], answer["precision"]) == ("onnxruntime", "fp32")
    assert answer["device"] == "CPUExecutionProvider"
    assert answer["latency_ms"] > 0


async def test_classify_default_top_k_is_the_package_one(http: aiohttp.ClientSession) -> None:
    async with http.post("/v1/models/tiny/classify", data=_image("PNG", (1, 2, 3))) as response:
        # The tiny package has 4 classes and the default top_k of 5 is capped to them.
        assert len((await response.json())["labels"]) == 4


async def test_status_and_metrics(http: aiohttp.ClientSession) -> None:
    async with http.get("/v1/status") as response:
        status = await response.json()
    assert status["profile"] == {"name": "test"}
    assert status["models"]["tiny"]["state"] == "READY"
    async with http.get("/v2/models/nope") as response:
        assert response.status == 404
    async with http.get("/metrics") as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    assert 'edgeagent_http_requests_total{method="GET",route="/v1/status",status="200"}' in text
    assert (
        'edgeagent_http_requests_total{method="GET",route="/v2/models/{name}",status="404"}' in text
    )
    assert "edgeagent_http_errors_total" not in text  # the status label already counts errors
    assert "edgeagent_http_request_duration_seconds_bucket" in text
    assert "edgeagent_inference_requests_total" in text  # the engine's, on the same registry
