"""Write every variant of a package: ONNX, OpenVINO IR and TFLite, each in FP32 and INT8.

Classifiers and the detector convert the same way, from the same calibration batch, so this
is shared by both package builders.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from torch import nn

from modelbuild import convert
from modelbuild.manifest import VariantFiles
from modelbuild.specs import ModelSpec


def write_variants(
    spec: ModelSpec,
    root: Path,
    formats: tuple[str, ...],
    model: nn.Module,
    calibration: np.ndarray,
    progress: Callable[[str], None],
) -> list[VariantFiles]:
    """Convert in every format asked for; returns the variants in preference order."""
    name = spec.name
    variants: list[VariantFiles] = []
    steps: list[tuple[str, Callable[[], None], VariantFiles]] = [
        (
            "onnx fp32",
            lambda: convert.export_onnx(
                model, calibration, root / f"{name}.fp32.onnx", spec.output_name
            ),
            VariantFiles("onnxruntime", "fp32", (f"{name}.fp32.onnx",)),
        ),
        (
            "onnx int8",
            lambda: convert.quantize_onnx(
                root / f"{name}.fp32.onnx", root / f"{name}.int8.onnx", calibration, root
            ),
            VariantFiles("onnxruntime", "int8", (f"{name}.int8.onnx",)),
        ),
    ]
    if "openvino" in formats:
        steps += [
            (
                f"openvino {precision}",
                lambda p=precision: convert.export_openvino(
                    root / f"{name}.{p}.onnx", root / f"{name}.{p}.xml"
                ),
                VariantFiles(
                    "openvino", precision, (f"{name}.{precision}.xml", f"{name}.{precision}.bin")
                ),
            )
            for precision in ("fp32", "int8")
        ]
    if "tflite" in formats:
        steps += [
            (
                "tflite fp32",
                lambda: convert.export_tflite(model, calibration, root / f"{name}.fp32.tflite"),
                VariantFiles("litert", "fp32", (f"{name}.fp32.tflite",), "NHWC"),
            ),
            (
                "tflite int8",
                lambda: convert.quantize_tflite(model, calibration, root / f"{name}.int8.tflite"),
                VariantFiles("litert", "int8", (f"{name}.int8.tflite",), "NHWC"),
            ),
        ]
    for label, step, variant in steps:
        started = time.perf_counter()
        step()
        variants.append(variant)
        progress(f"{label} written in {time.perf_counter() - started:.1f} s")
    return variants
