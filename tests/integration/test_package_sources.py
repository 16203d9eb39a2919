"""What ``edgeagent package`` reads from each format, on the zoo's digits files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.packaging.sources import read_source


def test_formats_say_their_tensors_layout_and_precision(zoo: Path) -> None:
    digits = zoo / "digits_mnv3"
    onnx_int8 = read_source(digits / "digits_mnv3.int8.onnx")
    assert (onnx_int8.runtime, onnx_int8.precision, onnx_int8.layout) == (
        "onnxruntime",
        "int8",
        "NCHW",
    )
    assert onnx_int8.inputs[0].shape == (None, 1, 32, 32)  # the dynamic batch
    tflite = read_source(digits / "digits_mnv3.int8.tflite")
    assert (tflite.precision, tflite.layout, tflite.inputs[0].dtype) == ("int8", "NHWC", "int8")
    quantization = tflite.inputs[0].quantization
    assert quantization is not None and quantization.scale > 0
    ir = read_source(digits / "digits_mnv3.int8.xml")
    assert (ir.runtime, ir.precision) == ("openvino", "int8")
    assert [f.suffix for f in ir.files] == [".xml", ".bin"]
    assert read_source(digits / "digits_mnv3.fp32.xml").precision == "fp32"


def test_openvino_ir_sources_pass_through(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    digits = zoo / "digits_mnv3"
    out = tmp_path / "ir"
    argv = [
        "package",
        str(digits / "digits_mnv3.fp32.xml"),
        str(digits / "digits_mnv3.int8.xml"),
        "--labels",
        str(digits / "labels.txt"),
        "--mean",
        "0.5",
        "--std",
        "0.5",
        "--heldout",
        str(digits / "heldout.npz"),
        "--max-images",
        "40",
        "--json",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(v["runtime"], v["precision"], v["kept"]) for v in report["variants"]] == [
        ("openvino", "fp32", True),
        ("openvino", "int8", True),
    ]
    package = load_package(out)
    assert [sorted(f.name for f in v.files) for v in package.variants] == [
        ["digits_mnv3.fp32.bin", "digits_mnv3.fp32.xml"],
        ["digits_mnv3.int8.bin", "digits_mnv3.int8.xml"],
    ]
    assert report["reference"]["accuracy"] >= 95
