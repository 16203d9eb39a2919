"""Package names from file names, converters' whole messages, the PyTorch exporter from anywhere.

Issue 24: ``hey_jarvis_v0.1.onnx`` was named ``hey_jarvis_v0`` (cut at the first dot), OpenVINO
conversion failures were reported by their first line (a C++ source location), and the
exporter the error message recommends failed outside the repository root.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from edgeagent.models.names import NAME_RE
from edgeagent.packaging.options import default_name
from edgeagent.packaging.variants import make_variants
from tests.support.helpers import REPO


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("hey_jarvis_v0.1.onnx", "hey_jarvis_v0.1"),
        ("mobilenet_v2.int8.onnx", "mobilenet_v2"),
        ("mobilenet_v2.fp32.xml", "mobilenet_v2"),
        ("yolov8n.onnx", "yolov8n"),
        ("model.v2.fp16.onnx", "model.v2"),
        ("weird name (copy).tflite", "weird_name__copy_"),
        ("ünïcode.onnx", "n_code"),
        ("x" * 80 + ".onnx", "x" * 64),
    ],
)
def test_default_names_strip_only_known_tags(file: str, name: str) -> None:
    got = default_name(Path(file))
    assert got == name
    assert NAME_RE.match(got)


def _unconvertible_onnx(path: Path) -> Path:
    """A graph with an operator no converter has a rule for (a custom domain's)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="custom.ops")],
        "unconvertible",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("custom.ops", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def test_openvino_conversion_failure_reports_the_operator(tmp_path: Path) -> None:
    source = _unconvertible_onnx(tmp_path / "custom.onnx")
    made, failed = make_variants(
        source,
        "custom",
        tmp_path,
        ("openvino",),
        None,
        method="minmax",
        reduce_range=False,
        progress=lambda line: None,
    )
    assert [m.runtime for m in made] == ["onnxruntime"]  # the fp32 copy
    (openvino,) = failed
    # The first line is only "Check 'false' failed at src/…/unconverted_ops_report.cpp:151:".
    assert "No conversion rule found for operations: custom.ops.NoSuchOp" in openvino.reason
    assert ".cpp:" not in openvino.reason


BUILD_PYTHON = REPO / ".venv-build" / "bin" / "python"


def test_torch_export_runs_from_any_directory(tmp_path: Path) -> None:
    """Run by its path, as the error message says, from a directory outside the checkout."""
    if not BUILD_PYTHON.exists():
        pytest.skip(f"{BUILD_PYTHON} missing: the PyTorch path needs the build environment")
    (tmp_path / "net.py").write_text("def make():\n    return None\n")
    script = REPO / "edgeagent" / "packaging" / "torch_export.py"
    done = subprocess.run(
        [str(BUILD_PYTHON), str(script), "net.py:nope", "--input-size", "4,4", "--out", "x.onnx"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "net.py: has no callable 'nope'" in done.stderr


def test_torch_missing_names_a_command_that_works_anywhere(tmp_path: Path) -> None:
    """In the agent's environment (no torch) the message gives the exporter's own path."""
    from edgeagent.packaging.errors import PackagingError
    from edgeagent.packaging.torch_export import load_factory

    (tmp_path / "net.py").write_text("def make():\n    return None\n")
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is importable here: nothing to recommend")
    with pytest.raises(PackagingError) as refused:
        load_factory(f"{tmp_path / 'net.py'}:make", None)
    script = REPO / "edgeagent" / "packaging" / "torch_export.py"
    assert f"python {script.resolve()} " in str(refused.value)
