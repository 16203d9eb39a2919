"""Build the detector package: synthetic scenes → trained grid detector → every variant →
mAP@0.5 per variant on held-out scenes → golden boxes → manifest.

The figures are measured with the agent's own decoder (``edgeagent.models.detector``, the
package's ``[detection]`` table as served), so they are what ``/v1/models/{name}/detect``
answers, not a second implementation's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from edgeagent.models.detector import decode_batch
from edgeagent.models.package import ModelPackage, load_package
from edgeagent.models.tasks import boxes
from edgeagent.models.tasks.detection import Detections
from edgeagent.models.tasks.detection_map import mean_average_precision
from modelbuild.data import normalize
from modelbuild.detector import STRIDE
from modelbuild.evaluate import run_variant
from modelbuild.manifest import VariantFiles, write_manifest
from modelbuild.scenes import Scenes, make_scenes
from modelbuild.specs import ModelSpec
from modelbuild.train_detector import train_detector
from modelbuild.variants import write_variants

TRAIN_SCENES = 1500
HELDOUT_SCENES = 200
HELDOUT_SEED = 10_000  # the held-out scenes never change with the build seed
EPOCHS = 8
CALIBRATION_IMAGES = 32
GOLDEN_IMAGES = 4
GOLDEN_IOU = 0.7  # a golden box must be found again this precisely
GOLDEN_SCORE_TOLERANCE = 0.15
GOLDEN_CONFIDENT = 0.5  # boxes at least this sure are recorded, and no others may appear

Progress = Callable[[str], None]


def _prep(spec: ModelSpec, images: np.ndarray) -> np.ndarray:
    return normalize(images, 1 / 255, spec.mean, spec.std)


def _train(spec: ModelSpec, model: torch.nn.Module, seed: int, progress: Progress) -> np.ndarray:
    """Train on fresh scenes; returns the INT8 calibration batch (training scenes)."""
    scenes = make_scenes(TRAIN_SCENES, spec.size, seed)
    images = torch.from_numpy(_prep(spec, scenes.images))
    history = train_detector(
        model, images, scenes.boxes, scenes.labels, epochs=EPOCHS, batch_size=32, lr=0.02, seed=seed
    )
    progress(f"trained {EPOCHS} epochs on {TRAIN_SCENES} scenes, final loss {history[-1]:.3f}")
    return images[:CALIBRATION_IMAGES].numpy()


def _detections(
    root: Path, package: ModelPackage, variant: VariantFiles, inputs: np.ndarray
) -> tuple[np.ndarray, list[Detections]]:
    """One variant's raw output rows for ``inputs`` and their decoded detections."""
    outputs = run_variant(
        variant.runtime, [root / f for f in variant.files], variant.layout, inputs
    )
    return outputs, decode_batch(package, {package.outputs[0].name: outputs})


def _evaluate(
    root: Path,
    package: ModelPackage,
    variants: list[VariantFiles],
    inputs: np.ndarray,
    truth: Scenes,
) -> tuple[dict, dict[str, list[Detections]]]:
    """mAP@0.5 of every variant on the held-out scenes, and its distance from FP32 ONNX."""
    reference = None
    report: dict = {"inputs": len(inputs), "variants": {}}
    found: dict[str, list[Detections]] = {}
    for variant in variants:
        outputs, detections = _detections(root, package, variant, inputs)
        reference = outputs if reference is None else reference
        key = f"{variant.runtime}/{variant.precision}"
        found[key] = detections
        report["variants"][key] = {
            "map50": mean_average_precision(
                detections, truth.boxes, truth.labels, len(package.labels)
            ),
            "max_abs_diff": float(np.abs(outputs - reference).max()),
        }
    return report, found


def golden_scenes(found: dict[str, list[Detections]], truth: Scenes, count: int) -> list[int]:
    """Held-out scenes every variant answers like FP32 under the golden check, busiest first.

    A scene with a borderline box (one variant a little above the confident score, another
    below) would fail a correct update, so only scenes that pass for every variant qualify;
    among them, scenes where FP32 is confident of as many boxes as the scene has objects, with
    the most objects, come first.
    """
    reference = next(iter(found.values()))
    scored = []
    for index, answer in enumerate(reference):
        record = boxes.record([answer], GOLDEN_IOU, GOLDEN_SCORE_TOLERANCE, GOLDEN_CONFIDENT)
        if any(boxes.problem(record, [each[index]]) for each in found.values()):
            continue
        complete = len(record["boxes"]) == len(truth.boxes[index])
        scored.append((not complete, -len(record["boxes"]), index))
    return [index for *_, index in sorted(scored)[:count]]


def _map_table(report: dict) -> dict:
    """mAP@0.5 per runtime, FP32 and INT8 and the gap in points (like digits' accuracy.json)."""
    table: dict = {}
    for key, entry in report["variants"].items():
        runtime, precision = key.split("/")
        table.setdefault(runtime, {})[precision] = round(entry["map50"], 4)
    for row in table.values():
        if "fp32" in row and "int8" in row:
            row["int8_minus_fp32_points"] = round(100 * (row["int8"] - row["fp32"]), 2)
    return {"split": "heldout.npz", "scenes": report["inputs"], "metric": "mAP@0.5", "map": table}


def _save_heldout(root: Path, scenes: Scenes) -> None:
    """The held-out scenes as the tests and the benchmark read them: uint8 images, and every
    object as a row of (scene index, class, x_min, y_min, x_max, y_max) in pixels."""
    rows = [
        np.column_stack([np.full(len(b), i), lab, b])
        for i, (b, lab) in enumerate(zip(scenes.boxes, scenes.labels, strict=True))
    ]
    np.savez_compressed(
        root / "heldout.npz", images=scenes.images, objects=np.concatenate(rows).astype(np.float32)
    )


def build_detector(
    spec: ModelSpec, root: Path, seed: int, formats: tuple[str, ...], progress: Progress
) -> dict:
    """Write the complete detector package into the (empty) directory ``root``."""
    torch.manual_seed(seed)
    model = spec.network()
    calibration = _train(spec, model, seed, progress)
    model.eval()
    labels = spec.labels()
    (root / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    variants = write_variants(spec, root, formats, model, calibration, progress)
    cells = (spec.size // STRIDE) ** 2
    write_manifest(root, spec, [-1, cells, 4 + len(labels)], variants, golden=None)
    package = load_package(root)

    heldout = make_scenes(HELDOUT_SCENES, spec.size, HELDOUT_SEED)
    inputs = _prep(spec, heldout.images)
    report, found = _evaluate(root, package, variants, inputs, heldout)
    with torch.no_grad():
        torch_rows = model(torch.from_numpy(inputs[:CALIBRATION_IMAGES])).numpy()
    onnx_rows, _ = _detections(root, package, variants[0], inputs[:CALIBRATION_IMAGES])
    report["torch_vs_onnx_max_abs_diff"] = float(np.abs(torch_rows - onnx_rows).max())
    chosen = golden_scenes(found, heldout, GOLDEN_IMAGES)
    reference = next(iter(found.values()))
    record = boxes.record(
        [reference[i] for i in chosen], GOLDEN_IOU, GOLDEN_SCORE_TOLERANCE, GOLDEN_CONFIDENT
    )
    np.savez(root / "golden.npz", inputs=inputs[chosen], **record)
    _save_heldout(root, heldout)
    (root / "accuracy.json").write_text(json.dumps(_map_table(report), indent=2) + "\n")
    (root / "evaluation.json").write_text(json.dumps(report, indent=2) + "\n")
    write_manifest(root, spec, [-1, cells, 4 + len(labels)], variants)  # now with golden.npz
    progress("mAP@0.5 " + ", ".join(f"{k} {v['map50']:.3f}" for k, v in report["variants"].items()))
    return report
