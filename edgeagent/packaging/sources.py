"""What a model file says about itself: its tensors, dtypes, shapes, layout and precision.

Each format is read with its own tool (onnx, LiteRT's interpreter, OpenVINO's reader) and
reduced to one description, so the rest of the packager never asks which format it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.packaging.errors import PackagingError
from edgeagent.runtimes.facts import NATIVE_SUFFIXES, native_runtime, weights_file


@dataclass(frozen=True)
class Quantization:
    """An int8/uint8 I/O tensor's real value = (q - zero_point) * scale."""

    scale: float
    zero_point: int


@dataclass(frozen=True)
class NativeTensor:
    """A tensor as the file declares it; None marks a dimension the file leaves open."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]
    quantization: Quantization | None = None


@dataclass(frozen=True)
class SourceModel:
    """One model file (with its companions: an IR's .bin) ready to become a variant."""

    path: Path
    runtime: str
    files: tuple[Path, ...]
    precision: str
    inputs: tuple[NativeTensor, ...]
    outputs: tuple[NativeTensor, ...]

    @property
    def layout(self) -> str | None:
        """NHWC or NCHW for a 4-D image input, judged from where the channels sit."""
        return guess_layout(self.inputs[0].shape)


def guess_layout(shape: tuple[int | None, ...]) -> str | None:
    if len(shape) != 4:
        return None
    channels_first = shape[1] in (1, 3, 4)
    channels_last = shape[3] in (1, 3, 4)
    if channels_last and not channels_first:
        return "NHWC"
    if channels_first and not channels_last:
        return "NCHW"
    return None


def read_source(path: Path) -> SourceModel:
    """Introspect one file; PackagingError names it when it is not a model this tool reads."""
    if not path.is_file():
        raise PackagingError(f"{path}: no such file")
    runtime = native_runtime(path)
    if runtime is None:
        known = ", ".join(sorted(NATIVE_SUFFIXES))
        raise PackagingError(
            f"{path}: not a model file this tool reads ({known}, or a PyTorch file.py:factory "
            "with --weights)"
        )
    if path.stat().st_size == 0:
        raise PackagingError(f"{path}: the file is empty")
    reader = {"onnxruntime": _read_onnx, "litert": _read_tflite, "openvino": _read_openvino}
    try:
        return reader[runtime](path)
    except PackagingError:
        raise
    except Exception as exc:  # each reader's own parse error: say which file it was
        raise PackagingError(f"{path}: cannot be read as {runtime} model: {exc}") from exc


_ONNX_DTYPES = {
    1: "float32",
    10: "float16",
    3: "int8",
    2: "uint8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
}


def _read_onnx(path: Path) -> SourceModel:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initialisers = {t.name for t in model.graph.initializer}

    def tensor(value: Any) -> NativeTensor:
        kind = value.type.tensor_type
        dtype = _ONNX_DTYPES.get(kind.elem_type)
        if dtype is None:
            raise PackagingError(f"{path}: tensor {value.name!r} has an unsupported element type")
        dims = tuple(d.dim_value if d.dim_value > 0 else None for d in kind.shape.dim)
        return NativeTensor(value.name, dtype, dims)

    ops = {node.op_type for node in model.graph.node}
    weights = {t.data_type for t in model.graph.initializer}
    precision = "int8" if {"QuantizeLinear", "QLinearConv", "ConvInteger"} & ops else "fp32"
    if precision == "fp32" and 10 in weights and 1 not in weights:
        precision = "fp16"
    inputs = tuple(tensor(v) for v in model.graph.input if v.name not in initialisers)
    return SourceModel(
        path,
        "onnxruntime",
        (path,),
        precision,
        inputs,
        tuple(tensor(v) for v in model.graph.output),
    )


def _read_tflite(path: Path) -> SourceModel:
    from ai_edge_litert import interpreter

    model = interpreter.Interpreter(model_path=str(path))

    def tensor(detail: dict[str, Any]) -> NativeTensor:
        signature = detail.get("shape_signature", detail["shape"])
        dims = tuple(None if int(d) < 0 else int(d) for d in signature)
        scale, zero_point = detail["quantization"]
        dtype = np.dtype(detail["dtype"]).name
        quantized = Quantization(float(scale), int(zero_point)) if scale else None
        return NativeTensor(detail["name"], dtype, dims, quantized)

    inputs = tuple(tensor(d) for d in model.get_input_details())
    outputs = tuple(tensor(d) for d in model.get_output_details())
    quantized = any(t.quantization is not None for t in inputs)
    precision = "int8" if quantized or inputs[0].dtype in ("int8", "uint8") else "fp32"
    return SourceModel(path, "litert", (path,), precision, inputs, outputs)


def _read_openvino(path: Path) -> SourceModel:
    import openvino as ov

    weights = weights_file(path)
    assert weights is not None  # read_source sends only an IR .xml here
    if not weights.is_file():
        raise PackagingError(f"{path}: OpenVINO IR needs its weights {weights.name} beside it")
    model = ov.Core().read_model(str(path))

    def tensor(port: Any) -> NativeTensor:
        dims = tuple(d.get_length() if d.is_static else None for d in port.get_partial_shape())
        dtype = np.dtype(port.get_element_type().to_dtype()).name
        return NativeTensor(port.get_any_name(), dtype, dims)

    kinds = {op.get_type_name() for op in model.get_ops()}
    precision = "int8" if "FakeQuantize" in kinds else "fp32"
    return SourceModel(
        path,
        "openvino",
        (path, weights),
        precision,
        tuple(tensor(p) for p in model.inputs),
        tuple(tensor(p) for p in model.outputs),
    )
