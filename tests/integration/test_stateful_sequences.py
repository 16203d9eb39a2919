"""Stateful models packaged and served per sequence, through a real daemon.

Three streaming models whose answer to a window depends on every window before it:
- ``accumulator.tflite`` (built here with TensorFlow, scripts/build_stateful_model.py): its
  state lives in TFLite resource variables inside the interpreter;
- ``leaky.onnx`` (built here with onnx): state passed through the graph, ``state_in`` →
  ``state_out``;
- Silero VAD (third-party, pinned from its wheel): ``state`` → ``stateN``, plus a scalar ``sr``.

Two client streams interleaved over HTTP (tritonclient, the stock library) must each get what
they get alone, which is what the model's own loop gives (state fed back by hand); shared as
one state they do not (the accumulator's second stream would start from the first's sum).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.grpc.aio as triton_grpc
import tritonclient.http as triton

from devtools.agent_process import RunningDaemon, running_daemon
from devtools.zoo import zoo_dir
from edgeagent.cli import main
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.models.package import load_package
from tests.support.helpers import REPO
from tests.support.stateful import leaky_onnx, leaky_reference, write_vad_heldout

MODELS = Path(os.environ.get("EDGEAGENT_THIRD_PARTY", REPO / "third-party-models"))
VAD = MODELS / "silero_vad.onnx"
TF_PYTHON = REPO / ".venv-tf" / "bin" / "python"
SAMPLES = 512
MAX_SEQUENCES = 3


def package(*argv: str) -> None:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["package", *argv, "--threads", "1", "--json"]) == 0, stdout.getvalue()


def _audio(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLES) / 16000
    rows = [
        0.3 * np.sin(2 * np.pi * (150 + 30 * seed + 40 * i) * t)
        if (i + seed) % 2
        else 0.01 * rng.standard_normal(t.size)
        for i in range(count)
    ]
    return np.stack(rows).astype(np.float32)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not VAD.is_file():
        pytest.fail(f"{VAD} not found: run scripts/setup.sh (it runs scripts/fetch_models.py)")
    root = tmp_path_factory.mktemp("stateful")
    models = root / "models"
    built = zoo_dir() / "stateful"  # set-up builds it; else build it here (a few seconds)
    if not (built / "accumulator.tflite").is_file():
        built = root
        subprocess.run(
            [str(TF_PYTHON), str(REPO / "scripts" / "build_stateful_model.py"), "--out", str(root)],
            check=True,
            capture_output=True,
        )
    package(
        str(built / "accumulator.tflite"), "--name", "acc", "--task", "tensor",
        "--out", str(models / "acc"),
    )  # fmt: skip
    leaky = leaky_onnx(root / "leaky.onnx")
    package(str(leaky), "--task", "tensor", "--variants", "graph", "--out", str(models / "leaky"))
    heldout = write_vad_heldout(root / "vad.npz", _audio(4, 0))
    package(
        str(VAD), "--name", "vad", "--task", "tensor",
        "--input-shape", f"input=1,{SAMPLES}", "--input-shape", "state=2,1,128",
        "--heldout", str(heldout), "--variants", "graph", "--out", str(models / "vad"),
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def daemon(built: Path) -> Iterator[RunningDaemon]:
    with running_daemon(built, f"max_sequences = {MAX_SEQUENCES}\n") as running:
        yield running


def test_packaging_recognises_both_kinds_of_state(built: Path) -> None:
    acc = load_package(built / "models" / "acc")
    assert acc.sequence is not None and acc.sequence.state == "variables"
    assert acc.golden is None  # a shared session's answers depend on its history
    leaky = load_package(built / "models" / "leaky")
    assert leaky.sequence is not None and leaky.sequence.pairs == (("state_in", "state_out"),)
    vad = load_package(built / "models" / "vad")
    assert vad.sequence is not None and vad.sequence.pairs == (("state", "stateN"),)


def _client(daemon: RunningDaemon) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(daemon.url.removeprefix("http://"))


def _step(
    client: triton.InferenceServerClient,
    model: str,
    feeds: dict[str, np.ndarray],
    sequence: int | str,
    start: bool,
    end: bool,
    headers: dict[str, str],
) -> np.ndarray:
    tensors = []
    for name, value in feeds.items():
        datatype = "FP32" if value.dtype == np.float32 else "INT64"
        tensor = triton.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value, binary_data=True)
        tensors.append(tensor)
    result = client.infer(
        model,
        tensors,
        sequence_id=sequence,
        sequence_start=start,
        sequence_end=end,
        headers=headers,
    )
    answer = result.get_response()
    names = [o["name"] for o in answer["outputs"]]
    assert not {"state_out", "stateN"} & set(names), "a sequence's state stays in the agent"
    return result.as_numpy(names[0])


def _streams(model: str) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    if model == "vad":
        sr = np.array(16000, np.int64)
        return tuple(  # type: ignore[return-value]
            [{"input": w[None], "sr": sr} for w in _audio(4, seed)] for seed in (1, 2)
        )
    key = {"acc": "serving_default_x:0", "leaky": "x"}[model]
    rng = np.random.default_rng(len(model))
    return tuple(  # type: ignore[return-value]
        [{key: rng.standard_normal((1, 4)).astype(np.float32)} for _ in range(4)] for _ in range(2)
    )


def _own_loop(model: str, stream: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The model's own answers to one stream alone, its state fed back by hand."""
    if model != "vad":
        return leaky_reference(np.concatenate([next(iter(f.values())) for f in stream]))[:, None]
    session = ort.InferenceSession(str(VAD), providers=["CPUExecutionProvider"])
    state, answers = np.zeros((2, 1, 128), np.float32), []
    for feeds in stream:
        answer, state = session.run(None, {**feeds, "state": state})
        answers.append(answer)
    return np.stack(answers)


@pytest.mark.parametrize("model", ["acc", "leaky", "vad"])
def test_interleaved_streams_each_get_their_own_state(daemon: RunningDaemon, model: str) -> None:
    client = _client(daemon)
    first, second = _streams(model)
    last = len(first) - 1

    def alone(stream: list[dict[str, np.ndarray]], sequence: int | str) -> np.ndarray:
        return np.stack(
            [
                _step(client, model, f, sequence, i == 0, i == last, daemon.headers)
                for i, f in enumerate(stream)
            ]
        )

    one, two = alone(first, 11), alone(second, "stream-b")
    mixed: dict[str, list[np.ndarray]] = {"a": [], "b": []}
    for i in range(len(first)):  # A B A B …: one model, two live sequences
        for key, stream, sequence in (("a", first, 21), ("b", second, "stream-c")):
            mixed[key].append(
                _step(client, model, stream[i], sequence, i == 0, i == last, daemon.headers)
            )
    np.testing.assert_allclose(np.stack(mixed["a"]), one, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack(mixed["b"]), two, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one, _own_loop(model, first), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(two, _own_loop(model, second), rtol=1e-4, atol=1e-5)
    client.close()


def _post(daemon: RunningDaemon, model: str, parameters: dict, **feeds: np.ndarray):
    body = {
        "parameters": parameters,
        "inputs": [
            {"name": n, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()}
            for n, v in feeds.items()
        ],
    }
    return requests.post(
        f"{daemon.url}/v2/models/{model}/infer", json=body, headers=daemon.headers, timeout=30
    )


def test_requests_outside_a_live_sequence_are_refused_clearly(daemon: RunningDaemon) -> None:
    x = np.ones((1, 4), np.float32)
    shared = _post(daemon, "acc", {}, **{"serving_default_x:0": x})
    assert shared.status_code == 400 and "sequence_id" in shared.json()["error"]
    missing = _post(daemon, "leaky", {}, x=x)
    assert missing.status_code == 400 and "state_in" in missing.json()["error"]
    held = _post(daemon, "leaky", {}, x=x, state_in=np.full((1, 4), 2.0, np.float32))
    assert held.status_code == 200  # a client that carries the state itself
    assert {o["name"]: o["data"] for o in held.json()["outputs"]}["state_out"] == [2.0] * 4
    unknown = _post(daemon, "leaky", {"sequence_id": 99}, x=x)
    assert unknown.status_code == 400 and "sequence_start" in unknown.json()["error"]
    stateless = _post(daemon, "tiny", {"sequence_id": 5}, input=np.zeros((1, 3, 8, 8), np.float32))
    assert stateless.status_code == 400 and "no state" in stateless.json()["error"]
    bad = _post(daemon, "leaky", {"sequence_id": 1.5, "sequence_start": True}, x=x)
    assert bad.status_code == 400 and "sequence_id" in bad.json()["error"]


def test_live_sequences_are_bounded_and_end_frees_one(daemon: RunningDaemon) -> None:
    x = np.ones((1, 4), np.float32)
    key = "serving_default_x:0"
    for sequence in range(100, 100 + MAX_SEQUENCES):
        started = _post(
            daemon, "acc", {"sequence_id": sequence, "sequence_start": True}, **{key: x}
        )
        assert started.status_code == 200, started.text
    refused = _post(daemon, "acc", {"sequence_id": 200, "sequence_start": True}, **{key: x})
    assert refused.status_code == 429 and "max_sequences" in refused.json()["error"]
    ended = _post(daemon, "acc", {"sequence_id": 100, "sequence_end": True}, **{key: x})
    assert ended.status_code == 200
    assert ended.json()["outputs"][0]["data"] == [3.0] * 4  # 2 × (0.5 × 1 + 1): its own state
    again = _post(daemon, "acc", {"sequence_id": 200, "sequence_start": True}, **{key: x})
    assert again.status_code == 200 and again.json()["outputs"][0]["data"] == [2.0] * 4
    for sequence in (101, 102, 200):
        assert _post(daemon, "acc", {"sequence_id": sequence, "sequence_end": True}, **{key: x}).ok


def test_grpc_clients_send_sequences_too(built: Path, tmp_path: Path) -> None:
    grpc_socket = tmp_path / "grpc.sock"
    config = parse_config(
        f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{built / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
        f"[grpc]\nenabled = true\nport = 0\nunix_socket = '{grpc_socket}'\n"
    )

    async def scenario() -> list[np.ndarray]:
        daemon = Daemon(config)
        await daemon.start()
        client = triton_grpc.InferenceServerClient(f"unix:{grpc_socket}")
        answers = []
        try:
            for i in range(3):
                for sequence in (7, 8):
                    x = np.full((1, 4), float(sequence), np.float32)
                    tensor = triton_grpc.InferInput("x", [1, 4], "FP32")
                    tensor.set_data_from_numpy(x)
                    result = await client.infer(
                        "leaky", [tensor], sequence_id=sequence, sequence_start=i == 0,
                        sequence_end=i == 2,
                    )  # fmt: skip
                    answers.append(result.as_numpy("y"))
        finally:
            await client.close()
            await daemon.stop()
        return answers

    answers = asyncio.run(scenario())
    for sequence, got in ((7, answers[0::2]), (8, answers[1::2])):
        want = leaky_reference(np.full((3, 4), float(sequence), np.float32))[:, None]
        np.testing.assert_allclose(np.stack(got), want, rtol=1e-6)
