#!/usr/bin/env python3
"""The field-to-fleet loop on the zoo's grid detector, measured end to end.

A distribution shift the detector never saw — its synthetic scenes from a camera at night (a
third of the light, a green cast, sensor noise: ``devtools.detection_scenes.night``) — reaches
an agent in the field alongside ordinary daytime traffic:

1. the agent (this tree's daemon, in-process) serves ``shapes_grid_mnv2`` with ``[capture]``
   on; ``--shifted`` night scenes and ``--field`` daytime ones (fresh scenes, seed 31337: none
   of them is in the package's held-out set) are posted to ``/detect`` and captured;
2. its uploader sends them to a hub (the server's app, in-process);
3. a reviewer draws the true boxes of the night scenes on the review route; the daytime ones
   stay unreviewed (the old head teaches on them);
4. ``edgeagent hub train`` retrains the head (torch in ``.venv-build``), packages the result
   with ``--head-from`` the old package and signs it as a canary — timed, under ``taskset``;
5. old and new model are scored (mAP@0.5, decoded as the agent decodes) on the package's own
   200 held-out scenes and on the same scenes at night (never captured).

    python scripts/bench_learning_detector.py [--shifted 200] [--field 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.detection_scenes import load_heldout, night  # noqa: E402
from devtools.figures import add_report_arguments, report  # noqa: E402
from devtools.learning_loop import (  # noqa: E402
    BUILD_PYTHON,
    add_training_arguments,
    field_to_hub,
    png,
    thumbnails,
    train_and_sign,
)
from edgeagent.models.detector import decode_batch  # noqa: E402
from edgeagent.models.package import load_package  # noqa: E402
from edgeagent.models.preprocess import image_tensor  # noqa: E402
from edgeagent.models.tasks.detection_map import mean_average_precision  # noqa: E402

PACKAGE = ROOT / "zoo" / "shapes_grid_mnv2"
FIELD_SEED = 31_337  # not the build's training seed, nor the held-out set's
MAKE_SCENES = """
import sys, numpy as np
sys.path.insert(0, sys.argv[2])
from modelbuild.scenes import make_scenes
s = make_scenes(int(sys.argv[3]), 96, int(sys.argv[4]))
pairs = enumerate(zip(s.boxes, s.labels))
objects = [np.column_stack([np.full(len(b), i), l, b]) for i, (b, l) in pairs]
np.savez(sys.argv[1], images=s.images, objects=np.concatenate(objects).astype(np.float32))
"""


def field_scenes(work: Path, count: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Fresh scenes as the zoo's build makes them (its photos live in the build environment)."""
    path = work / "field.npz"
    command = [str(BUILD_PYTHON), "-c", MAKE_SCENES, str(path), str(ROOT / "scripts")]
    subprocess.run([*command, str(count), str(FIELD_SEED)], check=True)
    with np.load(path) as data:
        images, objects = data["images"], data["objects"]
    scene = objects[:, 0].astype(np.int64)
    boxes = [objects[scene == i, 2:6] for i in range(len(images))]
    labels = [objects[scene == i, 1].astype(np.int64) for i in range(len(images))]
    return images, boxes, labels


def detection_map(onnx: Path, images: np.ndarray, boxes: list, labels: list) -> float:
    import onnxruntime as ort

    package = load_package(PACKAGE)
    assert package.preprocess is not None
    from PIL import Image

    x = np.concatenate([image_tensor(Image.fromarray(i), package.preprocess) for i in images])
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    name = package.inputs[0].name
    rows = np.concatenate(
        [session.run(None, {name: x[i : i + 64]})[0] for i in range(0, len(x), 64)]
    )
    found = decode_batch(package, {package.outputs[0].name: rows})
    return round(100 * mean_average_precision(found, boxes, labels, len(package.labels)), 2)


async def main_async(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-learning-detector-"))
    images, boxes, labels = field_scenes(work, args.shifted + args.field)
    sources = np.concatenate([night(images[: args.shifted], seed=1), images[args.shifted :]])
    rng = np.random.default_rng(0)
    posted = [png(sources[i]) for i in rng.permutation(len(sources))]
    names = load_package(PACKAGE).labels

    def verdict(index: int, row: dict) -> dict | None:
        if index >= args.shifted:
            return None  # daytime traffic stays unreviewed: the old head teaches on it
        drawn = [
            {"label": names[int(c)], "box": [round(float(v), 1) for v in box]}
            for box, c in zip(boxes[index], labels[index], strict=True)
        ]
        return {"status": "corrected", "detections": drawn}

    reviewed = await field_to_hub(work, PACKAGE, "detect", posted, thumbnails(sources), verdict)
    summary, seconds, out = train_and_sign(work, PACKAGE.name, PACKAGE, args.steps, args.cores)
    held = load_heldout(PACKAGE)
    dark = night(held.images, seed=2)
    before = PACKAGE / "shapes_grid_mnv2.fp32.onnx"
    after = next(out.glob("*.onnx"))
    figures = {
        "shifted_reviewed": reviewed,
        "field_unreviewed": args.field,
        "old_heldout_map50_before": detection_map(before, held.images, held.boxes, held.labels),
        "old_heldout_map50_after": detection_map(after, held.images, held.boxes, held.labels),
        "night_heldout_map50_before": detection_map(before, dark, held.boxes, held.labels),
        "night_heldout_map50_after": detection_map(after, dark, held.boxes, held.labels),
        "train_package_sign_s": round(seconds, 1),
        "cores": args.cores,
        "release": bool(summary.get("release")),
        "training": summary["training"],
    }
    for key in ("old", "night"):
        change = figures[f"{key}_heldout_map50_after"] - figures[f"{key}_heldout_map50_before"]
        figures[f"{key}_change_points"] = round(change, 2)
    shutil.rmtree(work, ignore_errors=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shifted", type=int, default=200, help="night scenes, reviewed")
    parser.add_argument("--field", type=int, default=200, help="daytime scenes, unreviewed")
    add_training_arguments(parser)
    add_report_arguments(parser)
    args = parser.parse_args()
    figures = asyncio.run(main_async(args))
    return report(figures, args)


if __name__ == "__main__":
    sys.exit(main())
