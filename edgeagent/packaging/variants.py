"""The optimised variants made from an fp32 ONNX model, each a file set in the package.

Each maker is optional and independent of the others, except OpenVINO INT8, which is converted
from the quantized ONNX (OpenVINO reads QDQ as its own low-precision graph).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeagent.packaging.errors import converter_message
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


def optimise_graph(fp32: Path, out: Path, level: str = "extended") -> Path:
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
    return out


def onnx_fp16(fp32: Path, out: Path) -> Path:
    """Weights and compute in fp16, inputs and outputs kept float32 (what CUDA/TensorRT want)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True)
    onnx.save(model, str(out))
    # The converter can break graphs with Loop/If bodies (a TF detector's NMS): it renames what
    # the bodies capture. Such a file fails to load on every device, so it is a failed
    # conversion, never a variant "not validated here". The proof is onnxruntime loading it:
    # onnx.checker also refuses the node order the converter leaves in plain graphs (its input
    # casts come last), which onnxruntime sorts and runs (NudeNet's YOLOv8n: mAP 1.000).
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    return out


def openvino_ir(onnx_path: Path, xml: Path, compress_to_fp16: bool) -> tuple[Path, Path]:
    """OpenVINO IR from ONNX; a QDQ ONNX becomes an INT8 IR."""
    import openvino as ov

    ov.save_model(ov.convert_model(str(onnx_path)), str(xml), compress_to_fp16=compress_to_fp16)
    return xml, xml.with_suffix(".bin")


def pin_input_shape(fp32: Path, shapes: Mapping[str, Sequence[int]], out: Path) -> Path:
    """The ONNX with its open image dimensions fixed to the package's (batch stays open).

    A graph whose height and width are symbolic quantizes and converts badly: OpenVINO cannot
    convert QDQ nodes of unknown rank, and shape inference cannot size the activations.
    """
    import onnx

    model = onnx.load(str(fp32))
    for value in model.graph.input:
        if value.name not in shapes:
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name], strict=True):
            if size > 0:
                dim.dim_value = size
            else:
                dim.dim_param = "batch"
    onnx.save(onnx.shape_inference.infer_shapes(model), str(out))
    return out


def reduce_range_for(setting: str) -> bool:
    """--reduce-range auto|on|off: auto means on where u8×s8 can saturate (x86 without VNNI)."""
    if setting == "auto":
        return not cpu_has_vnni()
    return setting == "on"


@dataclass(frozen=True)
class Failed:
    """A variant the packager tried to make and could not; reported, never shipped."""

    runtime: str
    precision: str
    device_class: str
    how: str
    reason: str


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
    quantized_source: bool = False,
) -> tuple[list[Made], list[Failed]]:
    """Every variant in ``wanted`` made from ``fp32`` into ``out`` (the fp32 ONNX first), and
    those whose conversion failed, with the converter's words.

    ``quantized_source``: the ONNX is itself quantized (QDQ, or integer ops of a dynamic
    quantization) and no fp32 original exists: it is served as it is (onnxruntime/int8) and
    OpenVINO's int8 IR is made from it; no float variant can be made from integers."""
    made: list[Made] = []
    failed: list[Failed] = []

    def attempt(
        runtime: str, precision: str, device: str, how: str, make: Callable[[], Sequence[Path]]
    ) -> bool:
        progress(f"{runtime}/{precision}: {how}")
        try:
            files = make()
        except Exception as exc:
            text = converter_message(exc)  # the whole message: its first line is a location
            failed.append(Failed(runtime, precision, device, how, f"conversion failed: {text}"))
            return False
        made.append(Made(runtime, precision, tuple(files), device, how))
        return True

    def copy(target: Path) -> list[Path]:
        target.write_bytes(fp32.read_bytes())
        return [target]

    quantized = out / f"{stem}.int8.onnx"
    if quantized_source:
        attempt("onnxruntime", "int8", "cpu", "source: the quantized file", lambda: copy(quantized))
        if "openvino" in wanted:
            xml8 = out / f"{stem}.int8.xml"
            ir = lambda: openvino_ir(fp32, xml8, compress_to_fp16=False)  # noqa: E731
            attempt("openvino", "int8", "cpu", "IR from the quantized ONNX", ir)
        return made, failed
    fp32_out = out / f"{stem}.fp32.onnx"
    if "graph" in wanted:
        attempt(
            "onnxruntime",
            "fp32",
            "cpu",
            "graph optimisation (extended: folding, fusions)",
            lambda: [optimise_graph(fp32, fp32_out)],
        )
    else:
        attempt("onnxruntime", "fp32", "cpu", "source", lambda: copy(fp32_out))
    has_int8 = False
    if "int8" in wanted and calibration is not None:
        rows = len(next(iter(calibration.values())))
        how = (
            f"QDQ u8 activations, per-channel s8 weights, {method} on {rows} inputs, "
            f"reduce_range {'on' if reduce_range else 'off'}"
        )

        def quantize() -> list[Path]:
            quantize_onnx(
                fp32, quantized, calibration, out, method=method, reduce_range=reduce_range
            )
            return [quantized]

        has_int8 = attempt("onnxruntime", "int8", "cpu", how, quantize)
    if "fp16" in wanted:
        half = out / f"{stem}.fp16.onnx"
        attempt(
            "onnxruntime",
            "fp16",
            "cuda/tensorrt",
            "fp16 weights, fp32 I/O",
            lambda: [onnx_fp16(fp32, half)],
        )
    if "openvino" in wanted:
        xml = out / f"{stem}.fp32.xml"
        attempt(
            "openvino",
            "fp32",
            "cpu",
            "IR from the ONNX",
            lambda: openvino_ir(fp32, xml, compress_to_fp16=False),
        )
        if has_int8:
            xml8 = out / f"{stem}.int8.xml"
            attempt(
                "openvino",
                "int8",
                "cpu",
                "IR from the QDQ ONNX",
                lambda: openvino_ir(quantized, xml8, compress_to_fp16=False),
            )
    if "openvino-fp16" in wanted:
        xml16 = out / f"{stem}.fp16.xml"
        attempt(
            "openvino",
            "fp16",
            "gpu/npu",
            "IR, fp16-compressed weights",
            lambda: openvino_ir(fp32, xml16, compress_to_fp16=True),
        )
    return made, failed
