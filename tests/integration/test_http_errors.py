"""Bad input over real sockets: each gets its status and a JSON error, and the server carries on."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import struct
import zlib
from collections.abc import AsyncIterator, Iterator

import aiohttp
import numpy as np
import pytest
from PIL import Image

from edgeagent.api import v2
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from tests.support.http_agent import AgentServer, tiny_agent, unix_session

H = v2.HEADER_LENGTH
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with tiny_agent(tmp_path_factory.mktemp("errors"), max_body_bytes=LIMIT) as server:
        yield server


@pytest.fixture
async def http(agent: AgentServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with unix_session(agent) as session:
        yield session


def _json_input(shape: list[int], datatype: str = "FP32", data=None) -> bytes:
    count = int(np.prod(shape))
    values = data if data is not None else [0.5] * count
    return json.dumps(
        {"inputs": [{"name": "input", "shape": shape, "datatype": datatype, "data": values}]}
    ).encode()


def _binary(shape: list[int], size: int, tail: int) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": shape,
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": size},
                }
            ]
        }
    ).encode()
    return head + b"\0" * tail, {H: str(len(head))}


def _jpeg() -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width``×``height``: PIL refuses it as a decompression bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def _with_parameters(**parameters: object) -> bytes:
    return json.dumps({**json.loads(_json_input([1, 3, 8, 8])), "parameters": parameters}).encode()


def _issue_13_requests() -> list[tuple[str, str, bytes, dict[str, str], int, str]]:
    """The inputs that answered 500 before (issue 10 #13)."""
    infer, classify = "/v2/models/tiny/infer", "/v1/models/tiny/classify"
    return [
        ("shape 0 x 10**30", infer, _json_input([0, 10**30], data=[]), {}, 400, "64-bit range"),
        (
            "shape 0 x 2**62 x 2**62",
            infer,
            _json_input([0, 2**62, 2**62], data=[]),
            {},
            400,
            "larger than any tensor",
        ),
        (
            "deep nesting",
            infer,
            b'{"inputs":' + b"[" * 5000 + b"]" * 5000 + b"}",
            {},
            400,
            "nested too deeply",
        ),
        ("timeout 10**400", infer, _with_parameters(timeout=10**400), {}, 400, "64-bit range"),
        ("decompression bomb", classify, _png_header(20000, 20000), {}, 400, "image refused"),
        ("jpeg cut at 500 bytes", classify, _jpeg()[:500], {}, 400, "corrupt image"),
    ]


def _bad_requests() -> list[tuple[str, str, bytes, dict[str, str], int, str]]:
    """(case, path, body, headers, status, fragment of the error)."""
    infer = "/v2/models/tiny/infer"
    right = 3 * 8 * 8 * 4
    body, _ = _binary([1, 3, 8, 8], right, right)
    return [
        ("malformed json", infer, b'{"inputs": [', {}, 400, "not valid JSON"),
        ("wrong shape", infer, _json_input([1, 3, 4, 4]), {}, 400, "dimension 2 is 4, expected 8"),
        ("wrong rank", infer, _json_input([3, 8, 8]), {}, 400, "has 3 dimensions"),
        ("wrong dtype", infer, _json_input([1, 3, 8, 8], "FP64"), {}, 400, "expects float32"),
        ("element count", infer, _json_input([1, 3, 8, 8], data=[1.0] * 5), {}, 400, "5 elements"),
        ("fp16 as json", infer, _json_input([1, 3, 8, 8], "FP16"), {}, 400, "FP16 cannot travel"),
        ("binary size", infer, *_binary([1, 3, 8, 8], right - 4, right - 4), 400, "needs 768"),
        ("binary tail", infer, *_binary([1, 3, 8, 8], right, right + 8), 400, "declare 768"),
        ("header > body", infer, body, {H: str(len(body) + 1)}, 400, "body has only"),
        (
            "unknown input",
            infer,
            _json_input([1, 3, 8, 8]).replace(b'"input"', b'"x"'),
            {},
            400,
            "no input 'x'",
        ),
        (
            "unknown output",
            infer,
            json.dumps(
                {**json.loads(_json_input([1, 3, 8, 8])), "outputs": [{"name": "y"}]}
            ).encode(),
            {},
            400,
            "unknown output 'y'",
        ),
        (
            "unknown model",
            "/v2/models/ghost/infer",
            _json_input([1, 3, 8, 8]),
            {},
            404,
            "unknown model 'ghost'",
        ),
        (
            "unknown version",
            "/v2/models/tiny/versions/9/infer",
            _json_input([1, 3, 8, 8]),
            {},
            404,
            "no version '9'",
        ),
        ("not an image", "/v1/models/tiny/classify", b"GIF89a....", {}, 400, "not a JPEG or PNG"),
        ("empty image", "/v1/models/tiny/classify", b"", {}, 400, "empty body"),
        ("top_k", "/v1/models/tiny/classify?top_k=99", b"x", {}, 400, "between 1 and 4"),
        ("huge body", infer, b" " * (LIMIT + 1), {}, 413, "max_body_bytes"),
        (
            "bad gzip",
            infer,
            b"not gzip at all",
            {"Content-Encoding": "gzip"},
            400,
            "could not be read",
        ),
        (
            "bad priority",
            infer,
            json.dumps(
                {**json.loads(_json_input([1, 3, 8, 8])), "parameters": {"priority": "hi"}}
            ).encode(),
            {},
            400,
            "priority",
        ),
    ]


BAD = _bad_requests() + _issue_13_requests()


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "fragment"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
async def test_bad_request_gets_its_status_and_a_json_error(
    http: aiohttp.ClientSession, path: str, body: bytes, headers: dict, status: int, fragment: str
) -> None:
    async with http.post(path, data=body, headers=headers) as response:
        assert response.status == status
        assert response.content_type == "application/json"
        error = (await response.json())["error"]
    assert fragment in error


async def test_streamed_body_over_the_limit_is_refused(http: aiohttp.ClientSession) -> None:
    """No Content-Length (chunked): the limit is enforced on what actually arrives."""

    async def chunks():
        for _ in range(LIMIT // 4096 + 2):
            yield b"\0" * 4096

    async with http.post("/v2/models/tiny/infer", data=chunks()) as response:
        assert response.status == 413


async def test_gzip_bomb_is_stopped_at_the_limit(http: aiohttp.ClientSession) -> None:
    bomb = gzip.compress(b"\0" * (LIMIT * 50))
    assert len(bomb) < LIMIT
    headers = {"Content-Encoding": "gzip"}
    async with http.post("/v2/models/tiny/infer", data=bomb, headers=headers) as response:
        assert response.status == 413


async def test_unknown_route_and_wrong_method_are_json(http: aiohttp.ClientSession) -> None:
    async with http.get("/v3/nothing") as response:
        assert response.status == 404
        assert (await response.json())["error"] == "Not Found: GET /v3/nothing"
    async with http.get("/v2/models/tiny/infer") as response:
        assert response.status == 405
        assert "POST" in response.headers["Allow"]
        assert "error" in await response.json()


async def test_bad_requests_do_not_disturb_good_ones(http: aiohttp.ClientSession) -> None:
    """Good and bad requests at once: every good one is answered right, every bad one refused."""
    rng = np.random.default_rng(1)
    good = [rng.random((1, 3, 8, 8), dtype=np.float32) for _ in range(12)]

    async def good_call(batch: np.ndarray) -> np.ndarray:
        body, length = v2.encode_request({"input": batch})
        async with http.post("/v2/models/tiny/infer", data=body, headers={H: str(length)}) as r:
            assert r.status == 200
            return v2.decode_response(await r.read(), r.headers[H]).outputs["logits"]

    async def bad_call(case) -> int:
        async with http.post(case[1], data=case[2], headers=case[3]) as response:
            return response.status

    results = await asyncio.gather(*(good_call(b) for b in good), *(bad_call(case) for case in BAD))
    served, refused = results[: len(good)], results[len(good) :]
    assert refused == [case[4] for case in BAD]
    singles = [await good_call(b) for b in good]
    for together, alone in zip(served, singles, strict=True):
        np.testing.assert_allclose(together, alone, rtol=1e-5)


@pytest.fixture
def slow_agent(tmp_path) -> Iterator[AgentServer]:
    """A model that waits long for batch company and queues at most one request."""
    with tiny_agent(
        tmp_path, max_queue=1, max_queue_delay_ms=400.0, adaptive_batching=False
    ) as server:
        yield server


async def test_queue_full_is_429_with_retry_after(slow_agent: AgentServer) -> None:
    body = _json_input([1, 3, 8, 8])
    async with unix_session(slow_agent) as http:

        async def call() -> tuple[int, str | None]:
            async with http.post("/v2/models/tiny/infer", data=body) as response:
                await response.read()
                return response.status, response.headers.get("Retry-After")

        answers = await asyncio.gather(*(call() for _ in range(4)))
    statuses = sorted(status for status, _ in answers)
    assert statuses[0] == 200
    assert 429 in statuses
    assert all(retry is not None for status, retry in answers if status == 429)


async def test_deadline_from_the_timeout_parameter_is_504(slow_agent: AgentServer) -> None:
    message = json.loads(_json_input([1, 3, 8, 8]))
    message["parameters"] = {"timeout": 50_000}  # µs: shorter than the 400 ms batch wait
    async with (
        unix_session(slow_agent) as http,
        http.post("/v2/models/tiny/infer", json=message) as response,
    ):
        assert response.status == 504
        assert "error" in await response.json()


async def test_throttled_requests_get_503_and_retry_after(agent: AgentServer) -> None:
    agent.limits = ServingLimits(shed_priority_from=2, retry_after_s=7, reason="hot: test")
    try:
        urgent = json.loads(_json_input([1, 3, 8, 8]))
        urgent["parameters"] = {"priority": 1}
        async with unix_session(agent) as http:
            async with http.post("/v2/models/tiny/infer", data=_json_input([1, 3, 8, 8])) as r:
                assert r.status == 503
                assert r.headers["Retry-After"] == "7"
                assert "hot: test" in (await r.json())["error"]
            async with http.post("/v2/models/tiny/infer", json=urgent) as response:
                assert response.status == 200
    finally:
        agent.limits = UNTHROTTLED


async def test_unloaded_model_is_503_until_loaded_again(agent: AgentServer) -> None:
    async with unix_session(agent) as http:
        async with http.post("/v2/repository/models/tiny/unload", data=b"") as response:
            assert response.status == 200
        async with http.post("/v2/models/tiny/infer", data=_json_input([1, 3, 8, 8])) as r:
            assert r.status == 503
            assert "unloaded" in (await r.json())["error"]
        async with http.get("/v2/models/tiny/ready") as response:
            assert response.status == 400
        async with http.post("/v2/repository/models/tiny/load") as response:
            assert response.status == 200
        async with http.post("/v2/models/tiny/infer", data=_json_input([1, 3, 8, 8])) as r:
            assert r.status == 200
