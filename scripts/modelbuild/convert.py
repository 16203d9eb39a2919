"""PyTorch → ONNX / TFLite / OpenVINO IR, FP32 and INT8 (static, calibrated).

Every converter gets the calibration data it needs explicitly, so the same images drive all
three INT8 variants and their top-1 agreement with FP32 can be compared across runtimes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

INPUT_NAME = "input"
OUTPUT_NAME = "logits"


def export_onnx(
    model: nn.Module, sample: np.ndarray, path: Path, output_name: str = OUTPUT_NAME
) -> None:
    """FP32 ONNX with a dynamic batch dimension, exported as ``edgeagent package`` exports."""
    from edgeagent.packaging.torch_export import export_onnx as export

    export(model, sample, path, INPUT_NAME, output_name)


def quantize_onnx(fp32: Path, out: Path, calibration: np.ndarray, workdir: Path) -> None:
    """Static INT8 QDQ (uint8 activations, per-channel int8 weights), as ``edgeagent package``
    makes it: one quantizer for the zoo and for users' models.

    Weights use 7 bits (``reduce_range``) whatever CPU builds the zoo: on x86 CPUs with AVX2 but
    no VNNI (an AMD EPYC here) full-range weights saturate the U8S8 kernels. Measured on
    MobileNetV3-Small over the tests' 60 photo crops: top-1 agreement with FP32 0.58 full-range,
    0.72 with 7-bit weights. The zoo's packages are served by CPUs of every kind.
    """
    from edgeagent.packaging.quantize import quantize_onnx as quantize

    quantize(fp32, out, {INPUT_NAME: calibration}, workdir, reduce_range=True)


def _channels_last(model: nn.Module) -> nn.Module:
    import litert_torch

    return litert_torch.to_channel_last_io(model, args=[0]).eval()


def _nhwc(batch: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(batch.transpose(0, 2, 3, 1)))


def export_tflite(model: nn.Module, sample: np.ndarray, path: Path) -> None:
    """FP32 TFLite with channels-last (NHWC) input, batch 1: no transposes left in the graph."""
    import litert_torch

    litert_torch.convert(_channels_last(model), (_nhwc(sample[:1]),)).export(str(path))


def quantize_tflite(model: nn.Module, calibration: np.ndarray, path: Path) -> None:
    """Full-integer static INT8 TFLite via PT2E: per-channel symmetric weights, histogram-
    calibrated activations; the file has int8 input/output tensors with their scale/zero-point."""
    import litert_torch
    from litert_torch.quantize.pt2e_quantizer import (
        PT2EQuantizer,
        get_symmetric_quantization_config,
    )
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = PT2EQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False)
    )
    sample = (_nhwc(calibration[:1]),)
    graph = torch.export.export(_channels_last(model), sample).module()
    graph = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for index in range(len(calibration)):
            graph(_nhwc(calibration[index : index + 1]))
    graph = convert_pt2e(graph, fold_quantize=False)
    converted = litert_torch.convert(
        graph, sample, quant_config=QuantConfig(pt2e_quantizer=quantizer)
    )
    converted.export(str(path))


def export_openvino(onnx_path: Path, xml_path: Path) -> None:
    """OpenVINO IR from the ONNX file (a QDQ ONNX becomes an INT8 IR); weights kept in FP32."""
    import openvino as ov

    ov.save_model(ov.convert_model(str(onnx_path)), str(xml_path), compress_to_fp16=False)
