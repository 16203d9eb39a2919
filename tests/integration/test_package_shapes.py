"""``edgeagent package`` beyond one batched image input, served by a real daemon (issue 24).

Silero VAD (a third-party ONNX fetched pinned from its wheel) has three inputs (``input
[batch, samples]``, ``state [2, batch, 128]``, a scalar int64 ``sr``) and returns its state:
packaged with ``--input-shape``, served as a tensor model through v2 ``infer`` with every input.
A model whose batch is fixed at 1 (a wake-word head, ``hey_jarvis_v0.1.onnx``) is declared so
and never merged: 16 concurrent HTTP clients all get their own answers (they got 500 ``Got: 6
Expected: 1`` when it was declared batch -1). PaddleOCR's direction classifier ends in Softmax:
its probabilities are served as it computes them, not softmaxed twice.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tomllib

from devtools.agent_process import RunningDaemon, running_daemon
from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.models.preprocess import preprocess_image
from tests.support.helpers import REPO
from tests.support.stateful import write_vad_heldout

MODELS = Path(os.environ.get("EDGEAGENT_THIRD_PARTY", REPO / "third-party-models"))
VAD = MODELS / "silero_vad.onnx"
CLIENTS = 16
SAMPLES = 512  # Silero VAD's window at 16 kHz


def package(*argv: str) -> dict:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["package", *argv, "--threads", "1", "--json"]) == 0
    return json.loads(stdout.getvalue())


def _audio(count: int, seed: int) -> np.ndarray:
    """Tones (speech-like energy) and quiet noise, one 512-sample window each."""
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLES) / 16000
    rows = [
        0.3 * np.sin(2 * np.pi * (180 + 40 * i) * t)
        if i % 2
        else 0.01 * rng.standard_normal(t.size)
        for i in range(count)
    ]
    return np.stack(rows).astype(np.float32)


def _wake_word_head(path: Path) -> Path:
    """A classifier head over [1, 16, 96] embeddings whose reshape bakes in the batch of 1."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(3).standard_normal((16 * 96, 1)).astype(np.float32) * 0.05
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "flat"], ["rows"]),
            helper.make_node("MatMul", ["rows", "w"], ["logit"]),
            helper.make_node("Sigmoid", ["logit"], ["score"]),
        ],
        "hey_jarvis",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 96])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 1])],
        [
            numpy_helper.from_array(np.array([1, 16 * 96], np.int64), "flat"),
            numpy_helper.from_array(weight, "w"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture(scope="module")
def built(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not VAD.is_file():
        pytest.fail(f"{VAD} not found: run scripts/setup.sh (it runs scripts/fetch_models.py)")
    root = tmp_path_factory.mktemp("shapes")
    models = root / "models"
    heldout = write_vad_heldout(root / "vad.npz", _audio(8, 0))
    package(
        str(VAD),
        "--name", "vad",
        "--task", "tensor",
        "--input-shape", f"input=1,{SAMPLES}",
        "--input-shape", "state=2,1,128",
        "--heldout", str(heldout),
        "--variants", "graph",
        "--out", str(models / "vad"),
    )  # fmt: skip
    head = _wake_word_head(root / "hey_jarvis_v0.1.onnx")
    package(str(head), "--task", "tensor", "--variants", "graph", "--out", str(models / "jarvis"))
    photos = root / "photos"
    photos.mkdir()
    for photo in ("china.jpg", "flower.png", "scene.jpg"):
        (photos / photo).write_bytes((zoo / "samples" / photo).read_bytes())
    labels = root / "directions.txt"
    labels.write_text("0\n180\n")
    common = ["--input-size", "48,192", "--labels", str(labels), "--mean", "0.5,0.5,0.5"]
    common += ["--std", "0.5,0.5,0.5", "--heldout", str(photos), "--variants", "graph"]
    package(str(MODELS / "ppocr_cls.onnx"), "--name", "direction", *common, "--out",
            str(models / "direction"))  # fmt: skip
    package(str(MODELS / "ppocr_cls.onnx"), "--name", "forced", "--softmax", *common, "--out",
            str(root / "forced"))  # fmt: skip
    return root


@pytest.fixture(scope="module")
def daemon(built: Path) -> Iterator[RunningDaemon]:
    with running_daemon(built) as running:  # serves built/models (and its tiny package)
        yield running


def _v2(name: str, **tensors: np.ndarray) -> dict:
    datatypes = {np.dtype("float32"): "FP32", np.dtype("int64"): "INT64"}
    return {
        "inputs": [
            {
                "name": key,
                "shape": list(value.shape),
                "datatype": datatypes[value.dtype],
                "data": value.ravel().tolist(),
            }
            for key, value in tensors.items()
        ]
    }


def _infer(daemon: RunningDaemon, name: str, **tensors: np.ndarray) -> requests.Response:
    return requests.post(
        f"{daemon.url}/v2/models/{name}/infer",
        json=_v2(name, **tensors),
        headers=daemon.headers,
        timeout=60,
    )


def _outputs(response: requests.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {
        o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"])
        for o in response.json()["outputs"]
    }


def test_each_input_is_declared_with_its_name_type_and_shape(built: Path) -> None:
    vad = load_package(built / "models" / "vad")
    assert [(t.name, t.dtype, t.shape) for t in vad.inputs] == [
        ("input", "float32", (1, SAMPLES)),
        ("state", "float32", (2, 1, 128)),
        ("sr", "int64", ()),
    ]
    assert [t.name for t in vad.outputs] == ["output", "stateN"]
    assert vad.task == "tensor" and vad.serving.max_batch_size == 1
    jarvis = load_package(built / "models" / "jarvis")
    assert jarvis.name == "hey_jarvis_v0.1"  # the version in the file name stays
    assert jarvis.inputs[0].shape == (1, 16, 96) and jarvis.serving.max_batch_size == 1
    report = json.loads((built / "models" / "jarvis" / "validation.json").read_text())
    assert report["variants"][0]["kept"] is True  # validated one feed at a time


def test_a_stateful_three_input_model_serves_16_concurrent_clients(
    built: Path, daemon: RunningDaemon
) -> None:
    """Each client streams its own audio, carrying the state the model answers back."""
    direct = ort.InferenceSession(str(VAD), providers=["CPUExecutionProvider"])

    def stream(client: int) -> list[float]:
        state = np.zeros((2, 1, 128), np.float32)
        probabilities = []
        for window in _audio(3, client + 1):
            out = _outputs(
                _infer(daemon, "vad", input=window[None], state=state, sr=np.array(16000))
            )
            want, want_state = direct.run(
                None, {"input": window[None], "state": state, "sr": np.array(16000)}
            )
            np.testing.assert_allclose(out["output"], want, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(out["stateN"], want_state, rtol=1e-4, atol=1e-5)
            state = out["stateN"].astype(np.float32)
            probabilities.append(float(out["output"][0, 0]))
        return probabilities

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(stream, range(CLIENTS)))
    assert len(answers) == CLIENTS and all(len(a) == 3 for a in answers)


def test_a_fixed_batch_model_is_never_merged_beyond_its_batch(daemon: RunningDaemon) -> None:
    direct = ort.InferenceSession(
        str(next((daemon.socket.parents[1] / "models" / "jarvis").glob("*.fp32.onnx"))),
        providers=["CPUExecutionProvider"],
    )
    rows = np.random.default_rng(5).standard_normal((CLIENTS, 1, 16, 96)).astype(np.float32)

    def ask(i: int) -> np.ndarray:
        return _outputs(_infer(daemon, "hey_jarvis_v0.1", x=rows[i]))["score"]

    with ThreadPoolExecutor(CLIENTS) as pool:
        for _ in range(3):  # several rounds: the batcher sees company after the first
            answers = list(pool.map(ask, range(CLIENTS)))
            for i, answer in enumerate(answers):
                np.testing.assert_allclose(
                    answer, direct.run(None, {"x": rows[i]})[0], rtol=1e-5, atol=1e-6
                )
    six = _infer(daemon, "hey_jarvis_v0.1", x=np.zeros((6, 16, 96), np.float32))
    assert six.status_code == 400
    assert "dimension 0 is 6, expected 1" in six.json()["error"]
    config = requests.get(
        f"{daemon.url}/v2/models/hey_jarvis_v0.1/config", headers=daemon.headers, timeout=30
    ).json()
    assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [1, 16, 96]


def test_probabilities_are_served_as_the_model_computes_them(
    zoo: Path, built: Path, daemon: RunningDaemon
) -> None:
    toml = tomllib.loads((built / "models" / "direction" / "model.toml").read_text())
    assert toml["postprocess"]["softmax"] is False  # it ends in Softmax
    forced = tomllib.loads((built / "forced" / "model.toml").read_text())
    assert forced["postprocess"]["softmax"] is True  # --softmax overrules
    package_dir = built / "models" / "direction"
    spec = load_package(package_dir).preprocess
    assert spec is not None
    image = (zoo / "samples" / "china.jpg").read_bytes()
    session = ort.InferenceSession(
        str(MODELS / "ppocr_cls.onnx"), providers=["CPUExecutionProvider"]
    )
    (own,) = session.run(None, {"x": preprocess_image(image, spec)})
    answer = requests.post(
        f"{daemon.url}/v1/models/direction/classify?top_k=2",
        data=image,
        headers={**daemon.headers, "Content-Type": "application/octet-stream"},
        timeout=60,
    ).json()
    best = int(np.argmax(own[0]))
    assert answer["indices"][0] == best
    assert answer["scores"][0] == pytest.approx(float(own[0][best]), abs=1e-4)
    assert sum(answer["scores"]) == pytest.approx(1.0, abs=1e-4)


def test_open_dimensions_are_refused_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not VAD.is_file():
        pytest.fail(f"{VAD} not found: run scripts/setup.sh (it runs scripts/fetch_models.py)")
    argv = ["package", str(VAD), "--task", "tensor", "--out", str(tmp_path / "p")]
    assert main(argv) == 2
    assert (
        f"{VAD}: input 'input' [?, ?] leaves dimension(s) 1 open: pass --input-shape "
        "input=-1,D1 (-1 keeps a dimension open)"
    ) in capsys.readouterr().err
    assert main([*argv, "--input-shape", "input=1,512,3"]) == 2
    assert "--input-shape input=1,512,3: 3 dimension(s), but input 'input'" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--input-shape", "input=1,512", "--input-shape", "state=3,1,128"]) == 2
    assert "--input-shape state=3,1,128: dimension 0 is fixed at 2" in capsys.readouterr().err
    assert main([*argv, "--input-shape", "nope=1"]) == 2
    assert "has no input 'nope' (inputs: input, state, sr)" in capsys.readouterr().err
    shapes = ["--input-shape", "input=1,512", "--input-shape", "state=2,1,128"]
    assert main([*argv, *shapes]) == 2  # no data: sr's integers cannot be made up
    assert "input(s) sr take integers" in capsys.readouterr().err
