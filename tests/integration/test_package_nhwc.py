"""An NHWC TFLite model stays NHWC end to end: package, metadata, v2 API, classify.

The zoo's digits TFLite file takes [1, 32, 32, 1]. Declared as an NHWC logical input (as
``edgeagent package`` declares it), clients send NHWC and the agent must not transpose again —
before the fix LiteRT answered "Dimension mismatch. Got 1 but expected 32 for dimension 2".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeagent.api.client import AgentClient
from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.models.preprocess import preprocess_image
from edgeagent.models.session import open_variant
from tests.support.http_agent import AgentServer

ai_edge_litert = pytest.importorskip("ai_edge_litert.interpreter")


def _direct(model: Path, batch: np.ndarray) -> np.ndarray:
    """The file run by LiteRT itself, one row at a time (its batch is baked in as 1)."""
    interpreter = ai_edge_litert.Interpreter(model_path=str(model))
    interpreter.allocate_tensors()
    source, target = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    rows = []
    for row in batch:
        interpreter.set_tensor(source["index"], row[None])
        interpreter.invoke()
        rows.append(interpreter.get_tensor(target["index"])[0].copy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def package(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nhwc") / "digits_nhwc"
    digits = zoo / "digits_mnv3"
    code = main(
        [
            "package",
            str(digits / "digits_mnv3.fp32.tflite"),
            "--name",
            "digits_nhwc",
            "--labels",
            str(digits / "labels.txt"),
            "--mean",
            "0.5",
            "--std",
            "0.5",
            "--heldout",
            str(digits / "heldout.npz"),
            "--max-images",
            "16",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


@pytest.fixture(scope="module")
def agent(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    server = AgentServer(tmp_path_factory.mktemp("agent"), [package]).start()
    yield server
    server.stop()


def _heldout(zoo: Path, rows: int) -> tuple[np.ndarray, np.ndarray]:
    with np.load(zoo / "digits_mnv3" / "heldout.npz") as data:
        return data["inputs"][:rows].transpose(0, 2, 3, 1).copy(), data["labels"][:rows]


def test_the_package_declares_nhwc_and_no_transpose(package: Path) -> None:
    loaded = load_package(package)
    assert loaded.inputs[0].shape == (-1, 32, 32, 1)
    assert loaded.inputs[0].layout == "NHWC"
    assert loaded.preprocess is not None and loaded.preprocess.layout == "NHWC"
    assert [v.layout for v in loaded.variants] == [None]


def test_metadata_and_v2_answers_are_nhwc(zoo: Path, package: Path, agent: AgentServer) -> None:
    client = AgentClient(socket_path=agent.socket, timeout=30)
    _, body = client.request("GET", "/v2/models/digits_nhwc")
    assert json.loads(body)["inputs"][0]["shape"] == [-1, 32, 32, 1]
    images, labels = _heldout(zoo, 6)
    served = client.infer("digits_nhwc", {"serving_default_args_0": images}).outputs
    logits = next(iter(served.values()))
    direct = _direct(package / "digits_nhwc.fp32.tflite", images)
    np.testing.assert_allclose(logits, direct, rtol=1e-5, atol=1e-5)
    assert (logits.argmax(axis=1) == labels).mean() >= 5 / 6


def test_classify_feeds_nhwc(zoo: Path, package: Path, agent: AgentServer) -> None:
    client = AgentClient(socket_path=agent.socket, timeout=30)
    image = (zoo / "samples" / "digit_7.png").read_bytes()
    answer = client.classify("digits_nhwc", image, top_k=1)
    assert answer["labels"] == ["7"]
    spec = load_package(package).preprocess
    assert spec is not None
    tensor = preprocess_image(image, spec)
    assert tensor.shape == (1, 32, 32, 1)
    expected = _direct(package / "digits_nhwc.fp32.tflite", tensor)
    assert int(expected.argmax()) == 7


def test_a_hand_written_nhwc_variant_is_not_transposed_twice(zoo: Path, package: Path) -> None:
    """The issue's own manifest: layout = "NHWC" on the input and on the variant."""
    manifest = package / "model.toml"
    text = manifest.read_text()
    edited = text.replace('runtime = "litert"\n', 'runtime = "litert"\nlayout = "NHWC"\n')
    assert edited != text
    manifest.write_text(edited)
    try:
        loaded = load_package(package)
        assert loaded.variants[0].layout == "NHWC"
        session = open_variant(loaded, threads=1)
        images, _ = _heldout(zoo, 2)
        answer = session.run({loaded.inputs[0].name: images})
        session.close()
        np.testing.assert_allclose(
            next(iter(answer.values())),
            _direct(package / "digits_nhwc.fp32.tflite", images),
            rtol=1e-5,
            atol=1e-5,
        )
    finally:
        manifest.write_text(text)
