"""Run built files on the three real runtimes (raw APIs) to measure what the package promises.

The agent's own runtime plugins are not importable from the build venv's point of view, so
this is a deliberately plain second implementation; the integration tests then check the
agent's plugins against the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def run_onnxruntime(path: Path, inputs: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return session.run(None, {name: inputs})[0]


def run_openvino(xml: Path, inputs: np.ndarray) -> np.ndarray:
    """FP32 inference precision is forced: OpenVINO's CPU default is bf16 where the CPU has it."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled(inputs)[0]


def run_litert(path: Path, inputs: np.ndarray, layout: str | None) -> np.ndarray:
    """One image at a time (the files have batch 1), quantizing int8 I/O with its own params."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=2)
    interpreter.allocate_tensors()
    source = interpreter.get_input_details()[0]
    target = interpreter.get_output_details()[0]
    if layout == "NHWC":
        inputs = inputs.transpose(0, 2, 3, 1)
    outputs = []
    for image in inputs:
        interpreter.set_tensor(source["index"], _quantize(image[None], source))
        interpreter.invoke()
        outputs.append(_dequantize(interpreter.get_tensor(target["index"]), target))
    return np.concatenate(outputs)


def _quantize(values: np.ndarray, detail: dict) -> np.ndarray:
    if detail["dtype"] == np.float32:
        return np.ascontiguousarray(values, np.float32)
    scale, zero = detail["quantization"]
    info = np.iinfo(detail["dtype"])
    return np.clip(np.round(values / scale) + zero, info.min, info.max).astype(detail["dtype"])


def _dequantize(values: np.ndarray, detail: dict) -> np.ndarray:
    if detail["dtype"] == np.float32:
        return values
    scale, zero = detail["quantization"]
    return (values.astype(np.float32) - zero) * np.float32(scale)


def run_variant(runtime: str, files: list[Path], layout: str | None, inputs: np.ndarray):
    """Logits of one package variant for a float32 NCHW batch."""
    if runtime == "onnxruntime":
        return run_onnxruntime(files[0], inputs)
    if runtime == "openvino":
        return run_openvino(files[0], inputs)
    return run_litert(files[0], inputs, layout)


def compare(reference: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """How far a variant's logits are from the FP32 ONNX reference, in the terms the tests use."""
    spread = float(np.abs(reference).max()) or 1.0
    return {
        "top1_agreement": float((reference.argmax(1) == logits.argmax(1)).mean()),
        "max_abs_diff": float(np.abs(reference - logits).max()),
        "max_rel_diff": float(np.abs(reference - logits).max() / spread),
    }
