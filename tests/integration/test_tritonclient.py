"""The stock tritonclient.http client, unchanged, against the agent's TCP listener."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.support.http_agent import AgentServer, direct_run, tiny_agent, triton_client


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with tiny_agent(tmp_path_factory.mktemp("triton")) as server:
        yield server


@pytest.fixture(scope="module")
def client(agent: AgentServer) -> Iterator[triton.InferenceServerClient]:
    client = triton_client(agent)
    yield client
    client.close()


@pytest.fixture(scope="module")
def reference(agent: AgentServer) -> Iterator:
    with direct_run(agent.packages[0]) as run:
        yield run


def _batch(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 3, 8, 8), dtype=np.float32)


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("tiny")
    assert client.is_model_ready("tiny", "1")
    assert not client.is_model_ready("tiny", "7")
    meta = client.get_server_metadata()
    assert meta["name"] == "edgeagent"
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(meta["extensions"])
    model = client.get_model_metadata("tiny")
    assert model["versions"] == ["1"]
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 8, 8]}]
    assert client.get_model_metadata("tiny", "1")["name"] == "tiny"
    config = client.get_model_config("tiny")
    assert config["max_batch_size"] == 4
    assert config["input"][0] == {"name": "input", "data_type": "TYPE_FP32", "dims": [3, 8, 8]}


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_infer_binary_and_json_with_compression(
    client: triton.InferenceServerClient, reference, binary: bool, compression: str | None
) -> None:
    batch = _batch(3, seed=hash((binary, compression)) % 1000)
    tensor = triton.InferInput("input", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch, binary_data=binary)
    outputs = [triton.InferRequestedOutput("logits", binary_data=binary)]
    result = client.infer(
        "tiny",
        [tensor],
        outputs=outputs,
        request_id="req-7",
        request_compression_algorithm=compression,
        response_compression_algorithm=compression,
        parameters={"custom_key": "tolerated"},
    )
    np.testing.assert_allclose(result.as_numpy("logits"), reference(batch), rtol=1e-5)
    response = result.get_response()
    assert response["id"] == "req-7"
    assert response["model_version"] == "1"


def test_infer_default_outputs_are_binary(client: triton.InferenceServerClient, reference) -> None:
    batch = _batch(1, seed=11)
    tensor = triton.InferInput("input", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    result = client.infer("tiny", [tensor], model_version="1")
    assert result.get_output("logits")["parameters"]["binary_data_size"] == 16
    np.testing.assert_allclose(result.as_numpy("logits"), reference(batch), rtol=1e-5)


def test_errors_reach_the_client_with_the_message(client: triton.InferenceServerClient) -> None:
    bad = triton.InferInput("input", [1, 3, 4, 4], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3, 4, 4), np.float32))
    with pytest.raises(InferenceServerException, match="dimension 2 is 4, expected 8"):
        client.infer("tiny", [bad])
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_metadata("nope")
    with pytest.raises(InferenceServerException, match="no version '7'"):
        client.get_model_metadata("tiny", "7")


def test_repository_load_unload_and_statistics(
    client: triton.InferenceServerClient, agent: AgentServer
) -> None:
    index = client.get_model_repository_index()
    assert index == [{"name": "tiny", "version": "1", "state": "READY", "reason": ""}]
    client.unload_model("tiny")
    assert not client.is_model_ready("tiny")
    assert not client.is_server_ready()
    assert client.get_model_repository_index()[0]["state"] == "UNAVAILABLE"
    with pytest.raises(InferenceServerException, match="tiny"):
        tensor = triton.InferInput("input", [1, 3, 8, 8], "FP32")
        tensor.set_data_from_numpy(_batch(1, 1))
        client.infer("tiny", [tensor])
    client.load_model("tiny")
    assert client.is_model_ready("tiny")
    tensor = triton.InferInput("input", [2, 3, 8, 8], "FP32")
    tensor.set_data_from_numpy(_batch(2, 2))
    client.infer("tiny", [tensor])
    stats = client.get_inference_statistics("tiny")["model_stats"]
    assert stats[0]["name"] == "tiny" and stats[0]["version"] == "1"
    assert stats[0]["inference_count"] == 2
    assert stats[0]["inference_stats"]["success"]["count"] == 1
    assert client.get_inference_statistics()["model_stats"][0]["name"] == "tiny"
    assert client.get_inference_statistics("tiny", "1")["model_stats"][0]["inference_count"] == 2
    with pytest.raises(InferenceServerException, match="unknown model 'ghost'"):
        client.load_model("ghost")
