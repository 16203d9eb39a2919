"""The stock tritonclient.grpc client, unchanged, against the agent's gRPC listener (TCP, Unix)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.http as triton_http
from tritonclient._plugin import InferenceServerClientPlugin
from tritonclient.utils import InferenceServerException

from edgeagent.api.grpc.server import GrpcServer
from edgeagent.api.grpc.settings import GrpcSettings
from edgeagent.api.http.app_keys import DATAPLANE
from edgeagent.api.shm.regions import SharedMemoryRegistry
from edgeagent.api.shm.settings import SharedMemorySettings
from edgeagent.engine.dataplane import DataPlane
from tests.support.http_agent import (
    ADMIN_TOKEN,
    TOKEN,
    AgentServer,
    direct_run,
    tiny_agent,
    triton_client,
)


class GrpcAgent:
    """The test agent's registry behind a real gRPC server on its loop (TCP + Unix socket)."""

    def __init__(self, agent: AgentServer, root: Path, host: str = "127.0.0.1"):
        self.agent = agent
        self.socket = root / "grpc.sock"
        self.regions = SharedMemoryRegistry(SharedMemorySettings())
        settings = GrpcSettings(enabled=True, host=host, port=0, unix_socket=self.socket)
        self.server = GrpcServer(
            DataPlane(agent.registry, agent.engine_settings),
            settings,
            server=agent.settings,
            regions=self.regions,
            tcp_port=0,
        )
        self.listening = agent.run(self.server.start)
        self.tcp = f"127.0.0.1:{self.server.port}"
        self.unix = f"unix:{self.socket}"

    def stop(self) -> None:
        self.agent.run(lambda: self.server.stop(5))
        self.regions.close()


class GrpcBearer(InferenceServerClientPlugin):
    """Adds the agent's token to every call (gRPC metadata keys are lower case)."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, request: Any) -> None:
        request.headers["authorization"] = f"Bearer {self.token}"


def tcp_client(served: GrpcAgent) -> triton.InferenceServerClient:
    """The stock client on the TCP listener, with the admin token (repository calls too)."""
    client = triton.InferenceServerClient(served.tcp)
    client.register_plugin(GrpcBearer(ADMIN_TOKEN))
    return client


def unix_client(served: GrpcAgent) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(served.unix)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcAgent]:
    root = tmp_path_factory.mktemp("grpc")
    with tiny_agent(root) as agent:
        grpc_agent = GrpcAgent(agent, root)
        yield grpc_agent
        grpc_agent.stop()
    assert not (root / "grpc.sock").exists(), "stop removes the Unix socket"


@pytest.fixture(scope="module", params=["tcp", "unix"])
def client(
    served: GrpcAgent, request: pytest.FixtureRequest
) -> Iterator[triton.InferenceServerClient]:
    client = tcp_client(served) if request.param == "tcp" else unix_client(served)
    yield client
    client.close()


@pytest.fixture(scope="module")
def reference(served: GrpcAgent) -> Iterator:
    with direct_run(served.agent.packages[0]) as run:
        yield run


def _batch(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 3, 8, 8), dtype=np.float32)


def _input(batch: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput("input", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    return tensor


def test_listens_on_tcp_and_unix_socket(served: GrpcAgent) -> None:
    assert served.listening == [f"grpc://{served.tcp}", served.unix]
    assert served.socket.is_socket()


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("tiny")
    assert client.is_model_ready("tiny", "1")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "edgeagent"
    assert {"model_repository", "statistics", "system_shared_memory"} <= set(meta["extensions"])
    model = client.get_model_metadata("tiny", as_json=True)
    assert model["versions"] == ["1"]
    assert model["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": ["-1", "3", "8", "8"]}
    ]
    config = client.get_model_config("tiny", as_json=True)["config"]
    assert config["max_batch_size"] == 4
    assert config["input"][0] == {
        "name": "input",
        "data_type": "TYPE_FP32",
        "dims": ["3", "8", "8"],
    }
    assert config["version_policy"] == {"specific": {"versions": ["1"]}}


def test_unknown_version_is_not_found(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.is_model_ready("tiny", "7")
    assert caught.value.status() == "StatusCode.NOT_FOUND"


def test_infer_raw_contents_matches_in_process(
    client: triton.InferenceServerClient, reference
) -> None:
    batch = _batch(3, seed=4)
    result = client.infer(
        "tiny",
        [_input(batch)],
        outputs=[triton.InferRequestedOutput("logits")],
        request_id="req-9",
        parameters={"custom_key": "tolerated"},
        priority=1,
        timeout=20_000_000,
        client_timeout=30,
    )
    np.testing.assert_allclose(result.as_numpy("logits"), reference(batch), rtol=1e-5)
    response = result.get_response()
    assert response.id == "req-9"
    assert response.model_version == "1"
    assert result.get_output("logits").datatype == "FP32"


def test_infer_default_outputs(client: triton.InferenceServerClient, reference) -> None:
    batch = _batch(1, seed=5)
    result = client.infer("tiny", [_input(batch)])
    np.testing.assert_allclose(result.as_numpy("logits"), reference(batch), rtol=1e-5)


@pytest.mark.parametrize(
    ("model", "shape", "output", "code", "words"),
    [
        ("nope", (1, 3, 8, 8), "logits", "NOT_FOUND", "nope"),
        ("tiny", (1, 3, 8, 9), "logits", "INVALID_ARGUMENT", "input"),
        ("tiny", (1, 3, 8, 8), "probs", "INVALID_ARGUMENT", "unknown output 'probs'"),
    ],
)
def test_bad_requests_get_status_codes_and_nothing_breaks(
    client: triton.InferenceServerClient, reference, model, shape, output, code, words
) -> None:
    batch = np.zeros(shape, np.float32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [_input(batch)], outputs=[triton.InferRequestedOutput(output)])
    assert caught.value.status() == f"StatusCode.{code}"
    assert words in caught.value.message()
    good = _batch(2, seed=6)
    result = client.infer("tiny", [_input(good)])
    np.testing.assert_allclose(result.as_numpy("logits"), reference(good), rtol=1e-5)


# Issue 23 finding 11: gRPC answered INTERNAL for these where HTTP answered 400, because its
# decoder built tensors without HTTP's shape checks. Data that fits the shape's element count
# (none, one) gets past the size check to numpy's own refusal.
HOSTILE_SHAPES = [
    ([0, 2**63 - 1], 0, "input 'input': shape [0, 9223372036854775807] is larger than any tensor"),
    ([1] * 1000, 1, "input 'input': shape has 1000 dimensions, at most 32"),
]


@pytest.mark.parametrize(("shape", "elements", "message"), HOSTILE_SHAPES)
def test_hostile_shapes_are_refused_alike_over_http_and_grpc(
    served: GrpcAgent, reference, shape: list[int], elements: int, message: str
) -> None:
    """Both transports go through the engine's one shape check: 400 and INVALID_ARGUMENT with
    the same message, and both keep serving."""
    refusals = {}
    for transport, client in (("http", triton_client(served.agent)), ("grpc", tcp_client(served))):
        module = triton_http if transport == "http" else triton
        tensor = module.InferInput("input", [elements], "FP32")
        tensor.set_data_from_numpy(np.zeros(elements, np.float32))
        tensor.set_shape(shape)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("tiny", [tensor])
        refusals[transport] = (caught.value.status(), caught.value.message())
        good = _batch(1, seed=12)
        served_answer = client.infer("tiny", [_as_input(module, good)]).as_numpy("logits")
        np.testing.assert_allclose(served_answer, reference(good), rtol=1e-5)
        client.close()
    assert refusals["http"][0] == "400"
    assert refusals["grpc"][0] == "StatusCode.INVALID_ARGUMENT"
    assert refusals["http"][1].startswith(message)
    assert refusals["grpc"][1] == refusals["http"][1]


def _as_input(module: Any, batch: np.ndarray) -> Any:
    tensor = module.InferInput("input", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    return tensor


def test_each_transport_calls_the_data_plane_once_per_request(
    served: GrpcAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP (binary and JSON) and gRPC each decode, make one ``DataPlane.infer(request, name,
    version)`` call and encode: no lookup or other data-plane call of their own."""
    calls: list[tuple[str, Any]] = []
    for plane in (served.agent.app[DATAPLANE], served.server.service.dataplane):
        _watch(plane, calls, monkeypatch)
    batch = _batch(2, seed=13)
    http = triton_client(served.agent)
    for binary in (True, False):
        tensor = triton_http.InferInput("input", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch, binary_data=binary)
        http.infer("tiny", [tensor], model_version="1")
        assert calls == [("infer", ("tiny", "1"))], f"HTTP, binary={binary}"
        calls.clear()
    http.close()
    grpc_client = tcp_client(served)
    grpc_client.infer("tiny", [_input(batch)], model_version="1")
    grpc_client.close()
    assert calls == [("infer", ("tiny", "1"))], "gRPC"


def _watch(plane: DataPlane, calls: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the data-plane calls a transport makes (the plane's own inner calls are not)."""
    infer, model = plane.infer, plane.model
    inside = []

    async def counted_infer(*args: Any) -> Any:
        calls.append(("infer", args[1:]))
        inside.append(True)
        try:
            return await infer(*args)
        finally:
            inside.pop()

    def counted_model(*args: Any) -> Any:
        if not inside:
            calls.append(("model", args))
        return model(*args)

    monkeypatch.setattr(plane, "infer", counted_infer)
    monkeypatch.setattr(plane, "model", counted_model)


def test_raw_contents_must_match_the_shape(served: GrpcAgent) -> None:
    """A raw tensor whose byte count disagrees with its shape is refused, naming the input."""
    client = tcp_client(served)
    tensor = triton.InferInput("input", [2, 3, 8, 8], "FP32")
    tensor.set_data_from_numpy(_batch(2, seed=1))
    tensor.set_shape([1, 3, 8, 8])  # the bytes of two rows, the shape of one
    with pytest.raises(InferenceServerException) as caught:
        client.infer("tiny", [tensor])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'input'" in caught.value.message()
    client.close()


def test_statistics_and_repository(served: GrpcAgent, reference) -> None:
    client = triton.InferenceServerClient(served.unix)
    client.infer("tiny", [_input(_batch(2, seed=8))])
    stats = client.get_inference_statistics("tiny", as_json=True)["model_stats"]
    assert stats[0]["name"] == "tiny"
    assert int(stats[0]["inference_count"]) >= 2
    assert int(stats[0]["inference_stats"]["success"]["count"]) >= 1
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "tiny", "version": "1", "state": "READY"} in [
        {k: m.get(k) for k in ("name", "version", "state")} for m in index
    ]
    client.unload_model("tiny")
    assert not client.is_model_ready("tiny")
    client.load_model("tiny")
    assert client.is_model_ready("tiny")
    batch = _batch(1, seed=9)
    np.testing.assert_allclose(
        client.infer("tiny", [_input(batch)]).as_numpy("logits"), reference(batch), rtol=1e-5
    )
    client.close()


def test_token_rule_matches_http(tmp_path: Path) -> None:
    """TCP calls need the bearer token (loopback included) and load/unload the admin token, as
    on HTTP; the Unix socket never needs one."""
    with tiny_agent(tmp_path) as agent:
        guarded = GrpcAgent(agent, tmp_path, host="0.0.0.0")
        try:
            tcp = triton.InferenceServerClient(guarded.tcp)
            with pytest.raises(InferenceServerException) as caught:
                tcp.is_server_live()
            assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
            assert "missing bearer token" in caught.value.message()
            with pytest.raises(InferenceServerException) as caught:
                tcp.is_server_live(headers={"authorization": "Bearer wrong"})
            assert "wrong bearer token" in caught.value.message()
            user = {"authorization": f"Bearer {TOKEN}"}
            assert tcp.is_server_live(headers=user)
            with pytest.raises(InferenceServerException) as caught:
                tcp.unload_model("tiny", headers=user)
            assert caught.value.status() == "StatusCode.PERMISSION_DENIED"
            assert agent.registry.status()["tiny"]["state"] == "READY"  # nothing changed
            tcp.close()
            unix = triton.InferenceServerClient(guarded.unix)
            assert unix.is_server_live()
            unix.close()
        finally:
            guarded.stop()


def test_typed_contents_are_accepted_and_counted(served: GrpcAgent, reference) -> None:
    """A client that sends typed ``contents`` (not raw bytes) is served; a short one refused."""
    import grpc

    from edgeagent.api.grpc.proto import inference_pb2 as pb

    batch = _batch(2, seed=11)
    with grpc.insecure_channel(served.unix) as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        request = pb.ModelInferRequest(model_name="tiny")
        tensor = request.inputs.add(name="input", datatype="FP32", shape=batch.shape)
        tensor.contents.fp32_contents.extend(batch.ravel().tolist())
        response = infer(request)
        logits = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 4)
        np.testing.assert_allclose(logits, reference(batch), rtol=1e-5)
        del tensor.contents.fp32_contents[-1]
        with pytest.raises(grpc.RpcError) as caught:
            infer(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "data has 383 elements" in caught.value.details()  # HTTP's JSON message


def test_messages_over_max_message_bytes_are_refused(tmp_path: Path) -> None:
    """[grpc] max_message_bytes bounds what a client may send; the server keeps serving."""
    with tiny_agent(tmp_path) as agent:
        server = GrpcServer(
            DataPlane(agent.registry, agent.engine_settings),
            GrpcSettings(
                enabled=True, port=0, unix_socket=tmp_path / "g.sock", max_message_bytes=1024
            ),
            server=agent.settings,
            regions=SharedMemoryRegistry(SharedMemorySettings()),
        )
        agent.run(server.start)
        client = triton.InferenceServerClient(f"unix:{tmp_path / 'g.sock'}")
        try:
            with pytest.raises(InferenceServerException) as caught:
                client.infer("tiny", [_input(_batch(2, seed=1))])  # 1536 bytes of tensor
            assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert client.infer("tiny", [_input(_batch(1, seed=1))]).as_numpy("logits").shape == (
                1,
                4,
            )
        finally:
            client.close()
            agent.run(lambda: server.stop(5))
