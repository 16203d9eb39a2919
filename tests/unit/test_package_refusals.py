"""``edgeagent package`` refuses every unusable input with the file's name and the flag to pass."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgeagent.cli import main
from edgeagent.models.package import load_package
from tests.support.helpers import write_tiny_onnx


def _onnx(path: Path, inputs: list, output: list, op: str = "GlobalAveragePool") -> Path:
    """A one-node ONNX model whose input and output shapes are what the test needs."""
    nodes = [helper.make_node(op, ["x"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["package", *argv]) == 2
    return capsys.readouterr().err


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.onnx"
    write_tiny_onnx(path)
    return path


def test_a_file_of_another_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"\x80\x02")
    err = refusal(capsys, str(weights), "--out", str(tmp_path / "p"))
    assert f"{weights}: not a model file this tool reads (.gguf, .onnx, .tflite, .xml" in err
    assert not (tmp_path / "p").exists()


def test_empty_and_corrupt_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty, corrupt = tmp_path / "empty.onnx", tmp_path / "corrupt.tflite"
    empty.touch()
    corrupt.write_bytes(b"not a flatbuffer at all")
    assert f"{empty}: the file is empty" in refusal(
        capsys, str(empty), "--out", str(tmp_path / "p")
    )
    err = refusal(capsys, str(corrupt), "--out", str(tmp_path / "p"))
    assert f"{corrupt}: cannot be read as litert model" in err


def test_openvino_ir_without_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xml = tmp_path / "model.xml"
    xml.write_text("<net/>")
    err = refusal(capsys, str(xml), "--out", str(tmp_path / "p"))
    assert f"{xml}: OpenVINO IR needs its weights model.bin beside it" in err


def test_open_image_size_asks_for_input_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _onnx(tmp_path / "any_size.onnx", ["N", 3, "H", "W"], ["N", 3, 1, 1])
    err = refusal(capsys, str(model), "--task", "tensor", "--out", str(tmp_path / "p"))
    assert "input 'x' [?, 3, ?, ?] leaves dimension(s) 2, 3 open: pass --input-size" in err


def test_unknown_task_asks_for_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _onnx(tmp_path / "map.onnx", ["N", 3, 8, 8], ["N", 3, 1, 1])
    err = refusal(capsys, str(model), "--out", str(tmp_path / "p"))
    assert f"{model}: cannot tell the task from its outputs (y [?, 3, 1, 1])" in err
    assert "pass --task classification|detection|segmentation|tensor" in err


def test_a_model_with_two_inputs_is_packaged_with_both(tmp_path: Path) -> None:
    """Refused until issue 24; now each input keeps its name, dtype and shape, batch open."""
    path = tmp_path / "two.onnx"
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    argv = [str(path), "--task", "tensor", "--variants", "graph", "--out", str(tmp_path / "p")]
    assert main(["package", *argv]) == 0
    package = load_package(tmp_path / "p")
    assert [(t.name, t.shape) for t in package.inputs] == [("a", (-1, 4)), ("b", (-1, 4))]
    assert package.serving.max_batch_size == 8  # both batch on their first axis: merged


def test_ambiguous_layout_asks_for_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _onnx(tmp_path / "square.onnx", ["N", 3, 8, 3], ["N", 3, 1, 1])
    err = refusal(capsys, str(model), "--task", "tensor", "--out", str(tmp_path / "p"))
    assert "is NCHW or NHWC: pass --layout NCHW|NHWC" in err


def test_int8_needs_calibration(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    err = refusal(capsys, str(tiny), "--variants", "int8", "--out", str(tmp_path / "p"))
    assert f"{tiny}: an int8 variant needs calibration data: pass --calibration" in err


def test_labels_must_match_the_classes(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    err = refusal(capsys, str(tiny), "--labels", str(labels), "--out", str(tmp_path / "p"))
    assert f"--labels {labels}: 3 labels, but the model has 4 classes" in err


def test_the_output_directory_must_be_new(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "keep.txt").write_text("mine")
    err = refusal(capsys, str(tiny), "--out", str(tmp_path / "p"))
    assert "already exists and is not empty: pass a new --out directory" in err
    assert (tmp_path / "p" / "keep.txt").read_text() == "mine"


def test_two_files_for_one_variant(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refusal(capsys, str(tiny), str(tiny), "--variants", "graph", "--out", str(tmp_path / "p"))
    assert "a second onnxruntime/fp32 variant" in err


def test_a_quantized_only_model_is_its_own_reference(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No fp32 original: the int8 file is packaged as it is, the reference of its validation
    and of the golden records, and the report says so."""
    int8 = zoo / "digits_mnv3" / "digits_mnv3.int8.onnx"
    argv = ["package", str(int8), "--out", str(tmp_path / "p"), "--json", "--timing-runs", "3"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "no fp32 source: digits_mnv3.int8.onnx (int8) is its own reference" in err
    report = json.loads(out)
    assert report["reference"]["precision"] == "int8"
    assert report["reference"]["note"] == (
        "no fp32 source: the quantized file itself is the reference"
    )
    judged = {f"{v['runtime']}/{v['precision']}": v for v in report["variants"]}
    assert judged["onnxruntime/int8"]["kept"] and judged["onnxruntime/int8"]["cosine_min"] == 1
    assert "openvino/int8" in judged  # made from the int8 file, judged against it
    package = load_package(tmp_path / "p")
    assert "onnxruntime/int8" in [v.key for v in package.variants]
    assert package.golden is not None


def test_nchw_file_behind_an_nhwc_reference(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    digits = zoo / "digits_mnv3"
    tflite, xml = digits / "digits_mnv3.fp32.tflite", digits / "digits_mnv3.fp32.xml"
    err = refusal(capsys, str(tflite), str(xml), "--out", str(tmp_path / "p"))
    assert f"{xml}: an NCHW file cannot serve the NHWC input" in err


def test_pytorch_source_without_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is importable here; the export itself is tested from .venv-build")
    module = tmp_path / "net.py"
    module.write_text("def make():\n    raise AssertionError('never called')\n")
    err = refusal(capsys, f"{module}:make", "--input-size", "8,8", "--out", str(tmp_path / "p"))
    assert f"{module}:make: torch is not installed in this environment" in err


def test_an_unexpected_failure_is_one_line_naming_its_cause() -> None:
    """What no check names still reaches the user as one line: the exception, where in the
    packager it happened and that nothing was written, never a traceback."""
    import numpy as np

    from edgeagent.commands.package import unexpected
    from edgeagent.packaging.probabilities import looks_like_embedding

    with pytest.raises(TypeError) as caught:
        looks_like_embedding(np.float64(1.0))  # a scalar has no rows
    line = unexpected(["model.onnx"], caught.value)
    assert line.startswith("edgeagent package: model.onnx: unexpected TypeError in ")
    assert "probabilities.py:" in line and "nothing was written" in line
    assert "\n" not in line and "Traceback" not in line


def test_a_language_model_task_on_a_tensor_model(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refusal(capsys, str(tiny), "--task", "embedding", "--out", str(tmp_path / "p"))
    assert "--task embedding: a language-model task (GGUF sources)" in err
    assert "pass --task tensor (for feature vectors too)" in err
    assert not (tmp_path / "p").exists()
