"""Fine-tune a grid detector's head on reviewed field samples, keeping what it knew.

The package's fp32 ONNX is split at its tail (``graph_tail``): the layers before it are a
frozen feature extractor run by onnxruntime once per image, the tail — the head's
convolutions and the decode the agent reads — is computed by torch from the graph's own
weights and trained. Two terms, as for a classifier's head (``head``):

- the reviewed boxes (a person accepted or corrected them on the dashboard), assigned to the
  rows of the cells around their centres (``grid_targets``);
- the old head's own rows on the unreviewed samples: the old model is the teacher of what the
  field still looks like, so learning the new distribution does not forget the old one.

The held-out reviewed samples are scored before and after (mAP@0.5 against the reviewers'
boxes, decoded as the agent decodes them), and the new weights are written into a copy of the
ONNX, which then goes through ``edgeagent package --head-from`` like any model. Run this file
with a Python that has torch, onnx and onnxruntime (``.venv-build``), by its path;
``edgeagent hub train`` does that.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path: the checkout (or site-packages) holding edgeagent
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np

from edgeagent.hub.train.graph_tail import (
    FrozenPart,
    TailError,
    TailModel,
    check_tail,
    find_tail,
    write_tail,
)
from edgeagent.hub.train.grid_targets import GridError, assign, row_loss
from edgeagent.hub.train.runner import NoStartingPoint, answer, fp32_source, trainer_parser
from edgeagent.models.detector import decode_batch
from edgeagent.models.package import ModelPackage, load_package
from edgeagent.models.preprocess import geometry_of, image_tensor, open_image
from edgeagent.models.tasks.detection_map import mean_average_precision

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
TEACHER_SCORE = 0.25  # an unreviewed row the old head scores this high also teaches its box
BATCH = 32


class DetectorTrainError(ValueError):
    pass


@dataclass
class Samples:
    """Images as input tensors, with their boxes as corners normalised to the input."""

    tensors: np.ndarray
    boxes: list[np.ndarray]
    labels: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.tensors)


def _check_head(package: ModelPackage) -> None:
    head = package.detection
    if package.task != "detection" or head is None or package.preprocess is None:
        raise DetectorTrainError(f"{package.name}: not an image detector with a [detection] head")
    readable = (
        head.style == "yolo"
        and head.normalized
        and head.box_format == "cxcywh"
        and not head.objectness
        and head.activation == "none"
    )
    rows = package.outputs[0].shape
    if not readable or len(package.outputs) != 1 or rows[-1] != 4 + len(package.labels):
        raise DetectorTrainError(
            f"{package.name}: its head is fine-tuned when it outputs [N, rows, 4 + classes] of "
            "normalised centre-size boxes and class probabilities (yolo, cxcywh, normalized, "
            "no objectness, activation none)"
        )


def load_yolo(root: Path, package: ModelPackage) -> Samples:
    """A YOLO dataset (``images/``, ``labels/`` of ``class cx cy w h`` normalised to the image)
    as input tensors and boxes mapped through the package's preprocessing (letterbox too)."""
    spec = package.preprocess
    assert spec is not None
    width, height = spec.size[1], spec.size[0]
    tensors, boxes, labels = [], [], []
    for path in sorted((root / "images").iterdir()):
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        image = open_image(path.read_bytes())
        geometry = geometry_of(image.size, spec)
        tensors.append(image_tensor(image, spec)[0])
        rows = np.zeros((0, 5), np.float32)
        label_file = root / "labels" / f"{path.stem}.txt"
        if label_file.is_file() and label_file.read_text().strip():
            try:
                rows = np.loadtxt(label_file, dtype=np.float32, ndmin=2)
            except ValueError as exc:
                raise DetectorTrainError(f"{label_file}: not YOLO rows ({exc})") from exc
        if rows.shape[1] != 5 or (len(rows) and rows[:, 0].max() >= len(package.labels)):
            raise DetectorTrainError(f"{label_file}: not YOLO rows of the model's classes")
        original = np.asarray(image.size * 2, np.float32)
        corners = np.concatenate(
            [rows[:, 1:3] - rows[:, 3:5] / 2, rows[:, 1:3] + rows[:, 3:5] / 2], 1
        )
        scale = np.asarray(geometry.scale * 2, np.float32)
        offset = np.asarray(geometry.offset * 2, np.float32)
        inside = corners * original * scale + offset
        boxes.append(inside / np.asarray([width, height, width, height], np.float32))
        labels.append(rows[:, 0].astype(np.int64))
    if not tensors:
        return Samples(np.zeros((0,), np.float32), [], [])
    return Samples(np.stack(tensors), boxes, labels)


def _rows(model: TailModel, features: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = [
            model.run(torch.from_numpy(features[i : i + BATCH])).numpy()
            for i in range(0, len(features), BATCH)
        ]
    return np.concatenate(out) if out else np.zeros((0,), np.float32)


def anchor_centres(model: TailModel, features: np.ndarray) -> np.ndarray:
    """Each row's cell centre: what the decode makes of a zero map (see ``grid_targets``)."""
    import torch

    last = model.tail.convolutions[-1]
    upto = model.tail.nodes[: model.tail.nodes.index(last) + 1]
    with torch.no_grad():
        logits = model.run(torch.from_numpy(features[:1]), upto)
        rows = model.run(torch.zeros_like(logits), model.tail.after_last_convolution())
    return rows[0, :, :2].numpy()


def detection_map(package: ModelPackage, rows: np.ndarray, samples: Samples) -> float | None:
    """mAP@0.5 of ``rows`` decoded as the agent does, against the samples' boxes."""
    if not len(samples):
        return None
    found = decode_batch(package, {package.outputs[0].name: rows})
    width, height = package.preprocess.size[1], package.preprocess.size[0]  # type: ignore[union-attr]
    pixels = np.asarray([width, height, width, height], np.float32)
    truth = [b * pixels for b in samples.boxes]
    return mean_average_precision(found, truth, samples.labels, len(package.labels))


def train_tail(
    model: TailModel,
    features: np.ndarray,
    targets: tuple[np.ndarray, np.ndarray],
    unlabelled: tuple[np.ndarray, np.ndarray],
    *,
    steps: int,
    lr: float,
    teacher_weight: float,
    seed: int = 0,
) -> list[float]:
    """Adam on mini-batches: the rows' loss on the reviewed boxes, plus the old head's rows as
    soft targets on the unreviewed images; the loss every 50 steps."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(list(model.parameters.values()), lr=lr)
    x = torch.from_numpy(features)
    scores, boxes = (torch.from_numpy(t) for t in targets)
    u, old_rows = (torch.from_numpy(t) for t in unlabelled)
    history = []
    for step in range(steps):
        pick = torch.randint(len(x), (min(BATCH, len(x)),), generator=generator)
        loss = row_loss(model.run(x[pick]), scores[pick], boxes[pick])
        if len(u):
            taught = torch.randint(len(u), (min(BATCH, len(u)),), generator=generator)
            teacher = old_rows[taught]
            soft = teacher[..., 4:] * (teacher[..., 4:] >= TEACHER_SCORE)
            loss = loss + teacher_weight * row_loss(model.run(u[taught]), soft, teacher[..., :4])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % 50 == 0 or step == steps - 1:
            history.append(round(float(loss.detach()), 4))
    return history


def fine_tune(
    package_dir: Path,
    train_dir: Path,
    heldout_dir: Path | None,
    unlabelled_dir: Path | None,
    out: Path,
    *,
    steps: int = 300,
    lr: float = 0.001,
    teacher_weight: float = 2.0,
    threads: int = 2,
) -> dict[str, Any]:
    """Train the tail of ``package_dir``'s fp32 ONNX on ``train_dir``; the ONNX to ``out``."""
    import onnx
    import torch

    started = time.perf_counter()
    torch.set_num_threads(threads)
    package = load_package(package_dir)
    _check_head(package)
    source = fp32_source(package)
    graph = onnx.load(str(source))
    tail = find_tail(graph)
    train = load_yolo(train_dir, package)
    if not len(train):
        raise DetectorTrainError(f"{train_dir}: no reviewed images")
    heldout = load_yolo(heldout_dir, package) if heldout_dir else Samples(np.zeros(0), [], [])
    fresh = load_yolo(unlabelled_dir, package) if unlabelled_dir else Samples(np.zeros(0), [], [])
    frozen = FrozenPart(graph, tail, package.inputs[0].name, threads)
    features, answers = {}, {}
    for key, samples in (("train", train), ("heldout", heldout), ("new", fresh)):
        features[key], answers[key] = frozen.run(samples.tensors)
    model = TailModel(tail)
    check_tail(model, features["train"], answers["train"])
    centres = anchor_centres(model, features["train"])
    targets = assign(train.boxes, train.labels, centres, len(package.labels))
    before = detection_map(package, answers["heldout"], heldout)
    old_rows = answers["new"]
    history = train_tail(
        model,
        features["train"],
        targets,
        (features["new"], old_rows),
        steps=steps,
        lr=lr,
        teacher_weight=teacher_weight,
    )
    after = detection_map(package, _rows(model, features["heldout"]), heldout)
    write_tail(source, out, model.trained())
    return {
        "layers": len(tail.convolutions),
        "labelled": len(train),
        "boxes": int(sum(len(b) for b in train.boxes)),
        "unlabelled": len(fresh),
        "heldout": len(heldout),
        "heldout_map50_before": None if before is None else round(before, 4),
        "heldout_map50_after": None if after is None else round(after, 4),
        "loss": history,
        "seconds": round(time.perf_counter() - started, 2),
        "onnx": str(out),
    }


def main(argv: list[str] | None = None) -> int:
    parser = trainer_parser(
        "fine-tune a grid detector package's head", "YOLO set of reviewed samples", lr=0.001
    )
    parser.add_argument("--heldout", type=Path, help="YOLO set scored before and after")
    args = parser.parse_args(argv)
    return answer(
        lambda: fine_tune(
            args.package,
            args.train,
            args.heldout,
            args.unlabelled,
            args.out,
            steps=args.steps,
            lr=args.lr,
            threads=args.threads,
        ),
        (DetectorTrainError, TailError, GridError, NoStartingPoint),
    )


if __name__ == "__main__":
    sys.exit(main())
