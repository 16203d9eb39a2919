"""The optimised variants made from an fp32 ONNX model, each a file set in the package.

Each maker is optional and independent of the others, except OpenVINO INT8, which is converted
from the quantized ONNX (OpenVINO reads QDQ as its own low-precision graph).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeagent.packaging.quantize import cpu_has_vnni, quantize_onnx

# --variants vocabulary: what each name adds to a package built from ONNX.
VARIANT_NAMES = ("graph", "int8", "openvino", "openvino-fp16", "fp16")
DEFAULT_VARIANTS = ("graph", "openvino", "openvino-fp16", "fp16")  # + int8 with --calibration


@dataclass(frozen=True)
class Made:
    """One variant file set the packager produced (or passed through)."""

    runtime: str
    precision: str
    files: tuple[Path, ...]
    device_class: str  # where the variant is meant to run: cpu, gpu/npu, cuda/tensorrt…
    how: str  # one line for the report
    layout: str | None = None


Progress = Callable[[str], None]


def optimise_graph(fp32: Path, out: Path, level: str = "extended") -> None:
    """onnxruntime's offline graph optimisation (constant folding, operator fusion), saved.

    ``extended`` fusions are CPU-provider specific; the saved model is for CPU serving, which
    is what the onnxruntime fp32 variant is ranked for in the profiles.
    """
    import onnxruntime as ort

    levels = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }
    options = ort.SessionOptions()
    options.graph_optimization_level = levels[level]
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(fp32), options, providers=["CPUExecutionProvider"])


def onnx_fp16(fp32: Path, out: Path) -> None:
    """Weights and compute in fp16, inputs and outputs kept float32 (what CUDA/TensorRT want)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True)
    onnx.save(model, str(out))


def openvino_ir(onnx_path: Path, xml: Path, compress_to_fp16: bool) -> tuple[Path, Path]:
    """OpenVINO IR from ONNX; a QDQ ONNX becomes an INT8 IR."""
    import openvino as ov

    ov.save_model(ov.convert_model(str(onnx_path)), str(xml), compress_to_fp16=compress_to_fp16)
    return xml, xml.with_suffix(".bin")


def reduce_range_for(setting: str) -> bool:
    """--reduce-range auto|on|off: auto means on where u8×s8 can saturate (x86 without VNNI)."""
    if setting == "auto":
        return not cpu_has_vnni()
    return setting == "on"


def make_variants(
    fp32: Path,
    stem: str,
    out: Path,
    wanted: tuple[str, ...],
    calibration: Mapping[str, np.ndarray] | None,
    *,
    method: str,
    reduce_range: bool,
    progress: Progress,
) -> list[Made]:
    """Every variant in ``wanted`` made from ``fp32`` into ``out``; the fp32 ONNX comes first."""
    made: list[Made] = []
    if "graph" in wanted:
        progress("onnxruntime graph optimisation (extended: constant folding, fusions)")
        optimised = out / f"{stem}.fp32.onnx"
        optimise_graph(fp32, optimised)
        made.append(Made("onnxruntime", "fp32", (optimised,), "cpu", "graph-optimised (extended)"))
    else:
        plain = out / f"{stem}.fp32.onnx"
        plain.write_bytes(fp32.read_bytes())
        made.append(Made("onnxruntime", "fp32", (plain,), "cpu", "source"))
    quantized = None
    if "int8" in wanted and calibration is not None:
        rows = len(next(iter(calibration.values())))
        progress(
            f"INT8 static quantization: QDQ U8S8, {method}, {rows} calibration inputs, "
            f"reduce_range={'on' if reduce_range else 'off'}"
        )
        quantized = out / f"{stem}.int8.onnx"
        quantize_onnx(fp32, quantized, calibration, out, method=method, reduce_range=reduce_range)
        how = f"QDQ u8 activations, per-channel s8 weights, {method}"
        made.append(Made("onnxruntime", "int8", (quantized,), "cpu", how))
    if "fp16" in wanted:
        progress("ONNX fp16 (for CUDA / TensorRT)")
        half = out / f"{stem}.fp16.onnx"
        onnx_fp16(fp32, half)
        made.append(Made("onnxruntime", "fp16", (half,), "cuda/tensorrt", "fp16 weights, fp32 I/O"))
    if "openvino" in wanted:
        progress("OpenVINO IR fp32")
        files = openvino_ir(fp32, out / f"{stem}.fp32.xml", compress_to_fp16=False)
        made.append(Made("openvino", "fp32", files, "cpu", "converted from ONNX"))
        if quantized is not None:
            progress("OpenVINO IR int8 (from the quantized ONNX)")
            files = openvino_ir(quantized, out / f"{stem}.int8.xml", compress_to_fp16=False)
            made.append(Made("openvino", "int8", files, "cpu", "converted from the QDQ ONNX"))
    if "openvino-fp16" in wanted:
        progress("OpenVINO IR fp16-compressed (for GPU / NPU)")
        files = openvino_ir(fp32, out / f"{stem}.fp16.xml", compress_to_fp16=True)
        made.append(Made("openvino", "fp16", files, "gpu/npu", "fp16-compressed weights"))
    return made
