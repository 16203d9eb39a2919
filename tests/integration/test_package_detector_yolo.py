"""A real Ultralytics YOLOv8 export packaged in one command, no edits, and served by /detect.

The model is NudeNet 3's ``320n.onnx`` (a YOLOv8n from Ultralytics 8.2, 18 classes, faces among
them), fetched pinned and hash-checked by scripts/fetch_models.py, as are the photos (the sample
images scikit-image and Matplotlib ship; three show people). The reference is written here from
the Ultralytics convention, independent of the agent's decoder: letterbox centred on grey 114,
RGB / 255, rows [4 + C, N] of cx, cy, w, h then class scores, best class, conf 0.25,
class-aware NMS at IoU 0.7, then the letterbox undone.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import requests
from PIL import Image

from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from tests.support.helpers import REPO
from tests.support.http_agent import TOKEN, AgentServer

MODELS = Path(os.environ.get("EDGEAGENT_THIRD_PARTY", REPO / "third-party-models"))
MODEL = MODELS / "nudenet_320n.onnx"
PHOTOS = MODELS / "photos"
PEOPLE = ("astronaut.png", "camera.png", "grace_hopper.jpg")
SIZE = 320
CONF, IOU = 0.25, 0.7  # Ultralytics' predict defaults


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not MODEL.is_file() or not (PHOTOS / PEOPLE[0]).is_file():
        pytest.fail(f"{MODEL} or its photos not found: run scripts/setup.sh (fetch_models.py)")
    out = tmp_path_factory.mktemp("yolo") / "yolo"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):  # the one command, as a new user types it
        code = main(
            ["package", str(MODEL), "--calibration", str(PHOTOS), "--out", str(out), "--json"]
        )
    assert code == 0
    return {"out": out, "report": json.loads(stdout.getvalue())}


@pytest.fixture(scope="module")
def agent(built: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    server = AgentServer(tmp_path_factory.mktemp("agent"), [built["out"]]).start()
    yield server
    server.stop()


def letterbox(image: Image.Image) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Ultralytics' LetterBox(auto=False, center=True): the tensor, the gain and the pad."""
    width, height = image.size
    gain = min(SIZE / width, SIZE / height)
    new_w, new_h = round(width * gain), round(height * gain)
    left, top = round((SIZE - new_w) / 2 - 0.1), round((SIZE - new_h) / 2 - 0.1)
    canvas = Image.new("RGB", (SIZE, SIZE), (114, 114, 114))
    canvas.paste(
        image.convert("RGB").resize((new_w, new_h), Image.Resampling.BILINEAR), (left, top)
    )
    tensor = np.asarray(canvas, np.float32).transpose(2, 0, 1)[None] / 255.0
    return np.ascontiguousarray(tensor), gain, (left, top)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None).prod()
    union = (a[2:] - a[:2]).prod() + (b[2:] - b[:2]).prod() - inter
    return float(inter / union) if union > 0 else 0.0


def ultralytics_boxes(
    raw: np.ndarray, gain: float, pad: tuple[int, int], original: tuple[int, int]
) -> list[tuple[int, float, np.ndarray]]:
    """One image's [4 + C, N] output → (class, score, xyxy in the photo's pixels)."""
    rows = raw.T
    scores = rows[:, 4:]
    classes, confidence = scores.argmax(1), scores.max(1)
    keep = confidence > CONF
    cx, cy, w, h = rows[keep, :4].T
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    classes, confidence = classes[keep], confidence[keep]
    chosen: list[int] = []
    for i in np.argsort(-confidence):  # greedy NMS, class by class (agnostic=False)
        if all(classes[j] != classes[i] or iou(boxes[i], boxes[j]) <= IOU for j in chosen):
            chosen.append(int(i))
    left, top = pad
    found = []
    for i in chosen:
        box = (boxes[i] - np.array([left, top, left, top])) / gain
        box = np.clip(box, 0, [original[0], original[1], original[0], original[1]])
        found.append((int(classes[i]), float(confidence[i]), box))
    return found


def matches(expected: list, answered: list) -> str:
    """Why ``answered`` (class, score, box) does not match ``expected`` one to one at IoU ≥ 0.9."""
    if len(expected) != len(answered):
        return f"{len(answered)} boxes, the reference has {len(expected)}"
    free = list(answered)
    for cls, _, box in expected:
        best = max(free, key=lambda a: iou(box, a[2]) if a[0] == cls else -1.0)
        if best[0] != cls or iou(box, best[2]) < 0.9:
            return f"no class-{cls} box at IoU ≥ 0.9 for {box.round(1).tolist()}"
        free.remove(best)
    return ""


def reference(photo: str) -> list:
    image = Image.open(PHOTOS / photo)
    tensor, gain, pad = letterbox(image)
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    (raw,) = session.run(None, {"images": tensor})
    return ultralytics_boxes(raw[0], gain, pad, image.size)


def test_package_declares_the_detector_from_the_file_alone(built: dict) -> None:
    package = load_package(built["out"])
    assert package.task == "detection" and package.detection is not None
    assert package.preprocess is not None and package.preprocess.letterbox
    assert package.preprocess.size == (SIZE, SIZE)  # from the metadata's imgsz
    assert package.outputs[0].shape == (-1, 22, 2100)
    assert len(package.labels) == 18 and package.labels[1] == "FACE_FEMALE"  # metadata names
    assert (package.detection.score_threshold, package.detection.iou_threshold) == (CONF, IOU)


def test_variants_are_judged_by_their_boxes(built: dict) -> None:
    report = built["report"]
    assert report["thresholds"]["min_map"] == 0.98
    variants = {f"{v['runtime']}/{v['precision']}": v for v in report["variants"]}
    assert variants["onnxruntime/fp32"]["map_vs_fp32"] == 1.0
    assert variants["onnxruntime/fp32"]["fp32_boxes"] > 0
    files = {p.name for p in built["out"].iterdir()}
    for key, figures in variants.items():
        good = figures["map_vs_fp32"] >= 0.98 and not figures["score_issue"]
        assert figures["kept"] == good, (key, figures)
        if not good:  # dropped with its figure, and none of its files shipped
            assert figures["reason"], key
            suffixes = {"onnxruntime": (".onnx",), "openvino": (".xml", ".bin")}
            dropped = [
                f"nudenet_320n.{figures['precision']}{s}" for s in suffixes[figures["runtime"]]
            ]
            assert not files & set(dropped), key
    for key in ("onnxruntime/int8", "openvino/int8"):  # the broken INT8 is left out
        assert not variants[key]["kept"], variants[key]
    kept = {v.key for v in load_package(built["out"]).variants}
    assert kept == {k for k, v in variants.items() if v["kept"]}


@pytest.mark.parametrize("photo", PEOPLE)
def test_every_kept_variant_matches_the_ultralytics_reference(built: dict, photo: str) -> None:
    package = load_package(built["out"])
    expected = reference(photo)
    assert expected, f"the reference finds nothing on {photo}"
    image = Image.open(PHOTOS / photo)
    tensor, gain, pad = letterbox(image)
    for variant in package.variants:
        session = open_variant(package, variant.runtime, variant.precision, threads=1)
        try:
            raw = session.run({"images": tensor})["output0"]
        finally:
            session.close()
        found = ultralytics_boxes(raw[0], gain, pad, image.size)
        assert matches(expected, found) == "", (variant.key, photo)


@pytest.mark.parametrize("photo", PEOPLE)
def test_detect_answers_like_the_ultralytics_reference(
    built: dict, agent: AgentServer, photo: str
) -> None:
    response = requests.post(
        f"{agent.url}/v1/models/{load_package(built['out']).name}/detect",
        data=(PHOTOS / photo).read_bytes(),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    answer = response.json()["detections"]
    served = [(d["index"], d["score"], np.asarray(d["box"])) for d in answer]
    assert matches(reference(photo), served) == ""
    labels = load_package(built["out"]).labels
    assert all(0 <= d["score"] <= 1 and d["label"] == labels[d["index"]] for d in answer)
