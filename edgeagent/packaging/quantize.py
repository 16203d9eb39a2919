"""Static INT8 quantization of an ONNX model: QDQ, uint8 activations, per-channel int8 weights.

U8S8 is the pairing x86 VNNI (VPDPBUSD: u8 × s8) and ARM dot-product kernels execute
natively; with int8 activations onnxruntime ran MobileNetV2 only 1.1× faster than fp32 on the
zoo's VNNI machine, with uint8 about 1.8×. OpenVINO reads the same QDQ file.

``reduce_range`` quantizes weights to 7 bits. Without VNNI, x86 executes u8 × s8 with
VPMADDUBSW, whose 16-bit intermediate sums can saturate with full-range weights; 7-bit weights
cannot saturate there, at the price of one bit of weight precision. ``auto`` decides from the
CPU flags of the machine doing the packaging (the usual target of the file it writes).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

CALIBRATION_METHODS = ("minmax", "entropy", "percentile")


class _Batches:
    """onnxruntime CalibrationDataReader over in-memory input arrays."""

    def __init__(self, feeds: Mapping[str, np.ndarray], batch_size: int) -> None:
        count = len(next(iter(feeds.values())))
        self._batches: Iterator[dict[str, np.ndarray]] = iter(
            [
                {name: array[i : i + batch_size] for name, array in feeds.items()}
                for i in range(0, count, batch_size)
            ]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    """``contextlib.chdir`` for Python 3.10 (the package still supports it)."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def cpu_has_vnni(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when this CPU has a u8×s8 dot-product instruction (AVX-512 VNNI or AVX-VNNI)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # not x86 Linux: ARM dot-product kernels do not saturate either
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")),
        [],
    )
    if not flags or "avx2" not in flags:
        return True
    return "avx512_vnni" in flags or "avx_vnni" in flags


def quantize_onnx(
    fp32: Path,
    out: Path,
    calibration: Mapping[str, np.ndarray],
    workdir: Path,
    *,
    method: str = "minmax",
    reduce_range: bool = False,
    batch_size: int = 8,
) -> None:
    """Write the INT8 QDQ model of ``fp32`` to ``out``, calibrated on ``calibration``.

    ``quant_pre_process`` first folds BatchNorm into the convolutions and infers shapes, as
    onnxruntime's quantization guide recommends, so the scales belong to the fused weights;
    where its symbolic shape inference fails, the model is quantized as it is (shapes from
    ONNX's plain inference, no fusion first).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    methods = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }
    logging.getLogger("root").setLevel(logging.WARNING)
    source, prepared = fp32.resolve(), (workdir / f"{fp32.stem}.prepared.onnx").resolve()
    try:
        # A failing symbolic shape inference saves its partial model (and external data) into
        # the working directory for debugging: keep those inside the build's own directory.
        with _working_directory(workdir):
            quant_pre_process(str(source), str(prepared))
    except Exception:
        # onnxruntime's symbolic shape inference asserts on some graphs (PaddleOCR's Concat on
        # axis -1); its optimiser then also leaves a bias reshape the quantizer turns into an
        # invalid int32 DequantizeLinear, so the fallback skips both and keeps ONNX's own
        # shape inference.
        quant_pre_process(
            str(source), str(prepared), skip_symbolic_shape=True, skip_optimization=True
        )
    try:
        quantize_static(
            str(prepared),
            str(out),
            _Batches(calibration, batch_size),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=reduce_range,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=methods[method],
        )
    finally:
        prepared.unlink(missing_ok=True)
