"""The v2 system shared-memory extension, driven by tritonclient's own utilities, unchanged.

Inputs are read from and outputs written to POSIX shared memory that the test (the "camera
app") creates with ``tritonclient.utils.shared_memory``; the agent over HTTP (and gRPC) sees
only region names. Bounds, keys and limits are refused with clear errors and break nothing.
tritonclient.http speaks TCP only, so this agent serves the extension on TCP
(``[shared_memory] tcp = true``) and the test's objects are open to every user, the only
objects the agent opens for a TCP caller it cannot identify (test_shm_attacks.py covers the
Unix socket, ownership and the default).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.integration.test_grpc import GrpcAgent
from tests.support.http_agent import AgentServer, direct_run, tiny_agent, triton_client

ROWS = 2
INPUT_BYTES = ROWS * 3 * 8 * 8 * 4
OUTPUT_BYTES = ROWS * 4 * 4


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with tiny_agent(tmp_path_factory.mktemp("shm"), max_regions=3, tcp=True) as server:
        yield server


@pytest.fixture
def client(agent: AgentServer) -> Iterator[triton.InferenceServerClient]:
    client = triton_client(agent)
    yield client
    client.unregister_system_shared_memory()  # every region: tests start from none
    client.close()


@pytest.fixture
def regions() -> Iterator[tuple]:
    """An input and an output region, as a client app creates them (unique keys per test),
    opened to every user as a TCP client's must be."""
    tag = uuid.uuid4().hex[:8]
    handles = (
        shm.create_shared_memory_region("in", f"/ea-in-{tag}", INPUT_BYTES),
        shm.create_shared_memory_region("out", f"/ea-out-{tag}", OUTPUT_BYTES),
    )
    for handle in handles:
        _object(handle).chmod(0o666)
    yield handles
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="module")
def reference(agent: AgentServer) -> Iterator:
    with direct_run(agent.packages[0]) as run:
        yield run


def _key(handle) -> str:
    return handle._shm_key


def _object(handle) -> Path:
    return Path("/dev/shm") / _key(handle).lstrip("/")


def _batch(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((ROWS, 3, 8, 8), dtype=np.float32)


def _shm_infer(client, regions, module=triton):
    tensor = module.InferInput("input", [ROWS, 3, 8, 8], "FP32")
    tensor.set_shared_memory("in", INPUT_BYTES)
    output = module.InferRequestedOutput("logits")
    output.set_shared_memory("out", OUTPUT_BYTES)
    return client.infer("tiny", [tensor], outputs=[output])


def test_infer_through_shared_memory_both_ways(client, regions, reference) -> None:
    inp, out = regions
    client.register_system_shared_memory("in", _key(inp), INPUT_BYTES)
    client.register_system_shared_memory("out", _key(out), OUTPUT_BYTES)
    status = {r["name"]: r for r in client.get_system_shared_memory_status()}
    assert status["in"] == {"name": "in", "key": _key(inp), "offset": 0, "byte_size": INPUT_BYTES}
    assert set(status) == {"in", "out"}
    for seed in (1, 2):  # the same regions serve frame after frame
        batch = _batch(seed)
        shm.set_shared_memory_region(inp, [batch])
        result = _shm_infer(client, regions)
        output = result.get_output("logits")
        assert "data" not in output  # nothing travelled in the body
        parameters = output["parameters"]
        assert "binary_data_size" not in parameters
        assert parameters["shared_memory_region"] == "out"
        assert parameters["shared_memory_byte_size"] == OUTPUT_BYTES
        answer = shm.get_contents_as_numpy(out, np.float32, [ROWS, 4])
        np.testing.assert_allclose(answer, reference(batch), rtol=1e-5)
    client.unregister_system_shared_memory("in")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["out"]
    with pytest.raises(InferenceServerException, match="no shared memory region 'in'"):
        _shm_infer(client, regions)


def test_offsets_within_a_region(client, regions, reference) -> None:
    """A region may start at an offset in the object; a tensor at an offset in the region."""
    inp, out = regions
    half = INPUT_BYTES // 2
    client.register_system_shared_memory("in", _key(inp), half, offset=half)
    client.register_system_shared_memory("out", _key(out), OUTPUT_BYTES)
    row = _batch(3)[:1]
    shm.set_shared_memory_region(inp, [row], offset=half)
    tensor = triton.InferInput("input", [1, 3, 8, 8], "FP32")
    tensor.set_shared_memory("in", half)
    output = triton.InferRequestedOutput("logits")
    output.set_shared_memory("out", OUTPUT_BYTES // 2, offset=OUTPUT_BYTES // 2)
    client.infer("tiny", [tensor], outputs=[output])
    answer = shm.get_contents_as_numpy(out, np.float32, [1, 4], offset=OUTPUT_BYTES // 2)
    np.testing.assert_allclose(answer, reference(row), rtol=1e-5)


@pytest.mark.parametrize(
    ("key", "size", "offset", "words"),
    [
        ("/../../etc/passwd", 16, 0, "not a POSIX shared memory name"),
        ("/no-such-region-at-all", 16, 0, "cannot open shared memory key"),
        (None, INPUT_BYTES + 1, 0, f"has {INPUT_BYTES} bytes; offset"),
        (None, INPUT_BYTES, 4, r"offset \+ byte_size needs 1540"),
        (None, 0, 0, "must be 1.."),
    ],
)
def test_bad_registrations_are_refused(client, regions, key, size, offset, words) -> None:
    inp, _ = regions
    with pytest.raises(InferenceServerException, match=words) as caught:
        client.register_system_shared_memory("bad", key or _key(inp), size, offset=offset)
    assert caught.value.status() == "400"
    assert client.get_system_shared_memory_status() == []


def test_a_symlink_under_dev_shm_is_not_followed(client) -> None:
    link = Path("/dev/shm") / f"ea-link-{uuid.uuid4().hex[:8]}"
    link.symlink_to("/etc/hostname")
    try:
        with pytest.raises(InferenceServerException, match="cannot open shared memory key"):
            client.register_system_shared_memory("link", f"/{link.name}", 4)
    finally:
        link.unlink()


def test_reads_and_writes_outside_the_region_are_refused(client, regions, reference) -> None:
    inp, out = regions
    client.register_system_shared_memory("in", _key(inp), INPUT_BYTES)
    client.register_system_shared_memory("out", _key(out), OUTPUT_BYTES)
    too_far = triton.InferInput("input", [ROWS, 3, 8, 8], "FP32")
    too_far.set_shared_memory("in", INPUT_BYTES, offset=4)
    with pytest.raises(InferenceServerException, match="runs past the end") as caught:
        client.infer("tiny", [too_far])
    assert caught.value.status() == "400"
    small = triton.InferRequestedOutput("logits")
    small.set_shared_memory("out", OUTPUT_BYTES - 4)
    tensor = triton.InferInput("input", [ROWS, 3, 8, 8], "FP32")
    tensor.set_shared_memory("in", INPUT_BYTES)
    with pytest.raises(InferenceServerException, match="needs 32 bytes but shared_memory_byte"):
        client.infer("tiny", [tensor], outputs=[small])
    batch = _batch(4)  # the agent still answers from the same regions
    shm.set_shared_memory_region(inp, [batch])
    _shm_infer(client, regions)
    np.testing.assert_allclose(
        shm.get_contents_as_numpy(out, np.float32, [ROWS, 4]), reference(batch), rtol=1e-5
    )


def test_region_count_is_limited_and_names_are_unique(client, regions) -> None:
    inp, _ = regions
    client.register_system_shared_memory("a", _key(inp), 16)
    with pytest.raises(InferenceServerException, match="already registered"):
        client.register_system_shared_memory("a", _key(inp), 16)
    client.register_system_shared_memory("b", _key(inp), 16)
    client.register_system_shared_memory("c", _key(inp), 16)
    with pytest.raises(InferenceServerException, match="max_regions") as caught:
        client.register_system_shared_memory("d", _key(inp), 16)
    assert caught.value.status() == "429"
    with pytest.raises(InferenceServerException, match="no shared memory region 'zz'") as caught:
        client.unregister_system_shared_memory("zz")
    assert caught.value.status() == "404"


def test_grpc_shares_the_extension(agent: AgentServer, tmp_path: Path, regions, reference) -> None:
    """tritonclient.grpc registers and infers through shared memory the same way."""
    served = GrpcAgent(agent, tmp_path)
    client = triton_grpc.InferenceServerClient(served.unix)
    try:
        inp, out = regions
        client.register_system_shared_memory("in", _key(inp), INPUT_BYTES)
        client.register_system_shared_memory("out", _key(out), OUTPUT_BYTES)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status["in"]["byte_size"] == str(INPUT_BYTES)
        batch = _batch(5)
        shm.set_shared_memory_region(inp, [batch])
        _shm_infer(client, regions, module=triton_grpc)
        np.testing.assert_allclose(
            shm.get_contents_as_numpy(out, np.float32, [ROWS, 4]), reference(batch), rtol=1e-5
        )
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status(as_json=True) == {}
    finally:
        client.close()
        served.stop()


def test_grpc_on_a_group_socket_opens_only_objects_anyone_may_open(
    agent: AgentServer, tmp_path: Path, regions
) -> None:
    """gRPC cannot tell the callers of a group-accessible socket apart ([grpc] socket_mode
    0660 here), so an object only its owner may open is refused, one anyone may open is not."""
    served = GrpcAgent(agent, tmp_path)
    client = triton_grpc.InferenceServerClient(served.unix)
    private = shm.create_shared_memory_region("private", f"/ea-p-{uuid.uuid4().hex[:8]}", 16)
    try:
        with pytest.raises(InferenceServerException, match="cannot be opened read-write by any"):
            client.register_system_shared_memory("private", _key(private), 16)
        client.register_system_shared_memory("in", _key(regions[0]), 16)  # the control: 0666
        assert list(client.get_system_shared_memory_status(as_json=True)["regions"]) == ["in"]
    finally:
        client.close()
        served.stop()
        shm.destroy_shared_memory_region(private)


def test_regions_are_closed_when_released(regions) -> None:
    """Unregistering (or the agent stopping) closes the region's descriptor in the agent."""
    from edgeagent.api.shm.regions import SharedMemoryRegistry, agent_user
    from edgeagent.api.shm.settings import SharedMemorySettings

    inp, out = regions
    me = agent_user()
    registry = SharedMemoryRegistry(SharedMemorySettings())
    registry.register(me, "in", _key(inp), 0, INPUT_BYTES)
    registry.register(me, "out", _key(out), 0, OUTPUT_BYTES)
    held = [registry.get(me, name) for name in ("in", "out")]
    registry.unregister(me, "in")
    assert held[0].closed and not held[1].closed
    with pytest.raises(Exception, match="'in' was unregistered"):  # a request that held it
        held[0].read(0, 16, "input 'x'")
    registry.close()
    assert held[1].closed
    assert registry.status(me) == []
    assert os.path.exists(f"/dev/shm/{_key(inp).lstrip('/')}"), "the client's object stays"
