"""Build one model package: weights → ONNX/TFLite/OpenVINO × FP32/INT8 → evaluate → manifest."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from modelbuild.data import digits_split, normalize, photo_crops
from modelbuild.evaluate import compare, run_onnxruntime, run_variant
from modelbuild.manifest import VariantFiles, write_manifest
from modelbuild.specs import ModelSpec
from modelbuild.train import (
    damp_residual_branches,
    predict,
    recalibrate_batchnorm,
    train_classifier,
)
from modelbuild.variants import write_variants

BN_IMAGES = 96  # photo crops for BatchNorm re-estimation (seeded models)
CALIBRATION_IMAGES = 32  # INT8 calibration set, the same for every runtime
EVAL_IMAGES = 32  # separate crops for the agreement figures (seeded models)
GOLDEN_IMAGES = 4
DIGITS_EPOCHS = 12

Progress = Callable[[str], None]


@dataclass
class Data:
    calibration: np.ndarray  # float32 NCHW, preprocessed
    evaluation: np.ndarray  # float32 NCHW: agreement inputs (photos) or the held-out digits
    labels: np.ndarray | None  # true classes of ``evaluation`` when known


def _prepare(spec: ModelSpec, model: torch.nn.Module, seed: int, progress: Progress) -> Data:
    """Give the seeded network sane weights and return the calibration and evaluation inputs.

    The digits model is trained; the ImageNet-shaped ones get damped residual branches and
    BatchNorm statistics re-estimated on photo crops.
    """

    def prep(images: np.ndarray) -> np.ndarray:
        return normalize(images, 1 / 255, spec.mean, spec.std)

    if spec.trained:
        split = digits_split(spec.size)
        train = torch.from_numpy(prep(split.train_images))
        history = train_classifier(
            model,
            train,
            torch.from_numpy(split.train_labels),
            epochs=DIGITS_EPOCHS,
            batch_size=64,
            lr=0.01,
            seed=seed,
            max_shift=2,
        )
        progress(f"trained {DIGITS_EPOCHS} epochs, final loss {history[-1]:.3f}")
        return Data(train.numpy()[:64], prep(split.heldout_images), split.heldout_labels)
    damped = damp_residual_branches(model)
    crops = prep(photo_crops(BN_IMAGES, spec.size, seed))
    recalibrate_batchnorm(
        model, (torch.from_numpy(crops[i : i + 32]) for i in range(0, BN_IMAGES, 32))
    )
    progress(f"{damped} residual branches damped, BatchNorm re-estimated on {BN_IMAGES} crops")
    evaluation = prep(photo_crops(EVAL_IMAGES, spec.size, seed + 1))
    return Data(crops[:CALIBRATION_IMAGES], evaluation, None)


def _evaluate(
    root: Path, variants: list[VariantFiles], model, data: Data
) -> tuple[dict, np.ndarray, np.ndarray]:
    """Every variant against the FP32 ONNX reference; accuracy too where labels are known.

    Returns the report, the reference logits and which inputs every variant gives the
    reference's top-1.
    """
    reference = run_onnxruntime(root / variants[0].files[0], data.evaluation)
    torch_logits = predict(model, data.evaluation)
    report: dict = {
        "inputs": len(data.evaluation),
        "torch_vs_onnx_max_abs_diff": float(np.abs(torch_logits - reference).max()),
        "variants": {},
    }
    unanimous = np.ones(len(reference), bool)
    for variant in variants:
        logits = run_variant(
            variant.runtime, [root / f for f in variant.files], variant.layout, data.evaluation
        )
        entry = compare(reference, logits)
        if data.labels is not None:
            entry["accuracy"] = float((logits.argmax(1) == data.labels).mean())
        report["variants"][f"{variant.runtime}/{variant.precision}"] = entry
        unanimous &= logits.argmax(1) == reference.argmax(1)
    return report, reference, unanimous


def golden_indices(reference: np.ndarray, unanimous: np.ndarray, count: int) -> np.ndarray:
    """Pick the health-check inputs: ones every variant classifies like FP32, clearest first.

    An input whose top-1 INT8 rounding legitimately moves would fail a correct update's health
    check, so inputs all variants agree on come first, ranked by the gap between the two best
    FP32 logits; each class is used once where possible, so that a model stuck on one answer
    cannot pass.
    """
    best_two = np.sort(reference, axis=1)[:, -2:]
    margin = best_two[:, 1] - best_two[:, 0]
    order = np.lexsort((-margin, ~unanimous))
    classes = reference.argmax(1)
    chosen: list[int] = []
    for index in order:
        if unanimous[index] and classes[index] not in classes[chosen]:
            chosen.append(int(index))
    chosen += [int(i) for i in order if i not in chosen]
    return np.sort(np.asarray(chosen[:count]))


def _accuracy(report: dict) -> dict:
    """The digits figures in the shape the brief asks for: per runtime FP32, INT8 and the gap."""
    table: dict = {}
    for key, entry in report["variants"].items():
        runtime, precision = key.split("/")
        table.setdefault(runtime, {})[precision] = entry["accuracy"]
    for row in table.values():
        if "fp32" in row and "int8" in row:
            row["int8_minus_fp32_points"] = round(100 * (row["int8"] - row["fp32"]), 2)
    return {"split": "heldout.npz", "samples": report["inputs"], "accuracy": table}


def build_package(
    spec: ModelSpec, root: Path, seed: int, formats: tuple[str, ...], progress: Progress
) -> dict:
    """Write the complete package into the (empty) directory ``root``; returns its report."""
    torch.manual_seed(seed)
    model = spec.network().eval()
    data = _prepare(spec, model, seed, progress)
    model.eval()
    labels = spec.labels()
    (root / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    variants = write_variants(spec, root, formats, model, data.calibration, progress)

    report, reference, unanimous = _evaluate(root, variants, model, data)
    golden = golden_indices(reference, unanimous, GOLDEN_IMAGES)
    top1 = reference[golden].argmax(1).astype(np.int64)
    np.savez(root / "golden.npz", inputs=data.evaluation[golden], top1=top1)
    if data.labels is not None:
        np.savez(root / "heldout.npz", inputs=data.evaluation, labels=data.labels.astype(np.int64))
        (root / "accuracy.json").write_text(json.dumps(_accuracy(report), indent=2) + "\n")
    (root / "evaluation.json").write_text(json.dumps(report, indent=2) + "\n")
    write_manifest(root, spec, [-1, len(labels)], variants)
    return report
