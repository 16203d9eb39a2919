"""The caller of an infer request is found only when the request names a shared-memory region:
a socket peer's credentials cost two getsockopt calls, and most requests name no region."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeagent.api import v2
from edgeagent.api.http import v2_routes
from edgeagent.api.shm import callers as shm_callers
from edgeagent.api.shm.regions import Caller, RegionNotFound, SharedMemoryRegistry
from edgeagent.api.shm.settings import SharedMemorySettings
from tests.support.helpers import write_tiny_package
from tests.support.http_agent import AgentServer, unix_session


def counting_identify(calls: list[int]):
    def identify() -> Caller:
        calls.append(1)
        return Caller("uid 1000", 1000)

    return identify


def body(parameters: dict) -> bytes:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": parameters}
    if not parameters:
        tensor["data"] = [1.0, 2.0]
    return json.dumps({"inputs": [tensor]}).encode()


async def test_an_http_request_naming_no_region_never_asks_who_its_peer_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def counted(request):
        asked.append(1)
        return shm_callers.http_caller(request)

    monkeypatch.setattr(v2_routes, "http_caller", counted)
    server = AgentServer(tmp_path, [write_tiny_package(tmp_path / "tiny")]).start()
    try:
        async with unix_session(server) as http:
            frame = {"name": "input", "datatype": "FP32", "shape": [1, 3, 8, 8]}
            frame["data"] = [0.0] * 192
            async with http.post("/v2/models/tiny/infer", json={"inputs": [frame]}) as reply:
                assert reply.status == 200, await reply.text()
    finally:
        server.stop()
    assert asked == []


def test_the_caller_is_identified_once_when_a_region_is_named() -> None:
    calls: list[int] = []
    regions = SharedMemoryRegistry(SharedMemorySettings()).of(counting_identify(calls))
    named = {"shared_memory_region": "frame", "shared_memory_byte_size": 8}
    with pytest.raises(RegionNotFound):
        v2.decode_request(body(named), None, regions)
    with pytest.raises(RegionNotFound):
        v2.decode_request(body(named), None, regions)
    assert calls == [1]
