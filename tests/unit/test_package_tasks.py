"""Tasks in the package format and the golden check each task implies (models/tasks/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeagent.models.names import TENSOR_TASKS
from edgeagent.models.package import PackageError, load_package
from edgeagent.models.tasks import golden_problem, golden_record


def _edit(package: Path, old: str, new: str) -> None:
    manifest = package / "model.toml"
    text = manifest.read_text()
    assert old in text
    manifest.write_text(text.replace(old, new))


@pytest.mark.parametrize("task", TENSOR_TASKS)
def test_every_task_is_accepted(tiny_package: Path, task: str) -> None:
    _edit(tiny_package, 'task = "classification"', f'task = "{task}"')
    assert load_package(tiny_package).task == task


def test_an_unknown_task_names_the_choices(tiny_package: Path) -> None:
    _edit(tiny_package, 'task = "classification"', 'task = "pose"')
    with pytest.raises(PackageError, match="task: 'pose' is not one of classification, detection"):
        load_package(tiny_package)


def test_labels_count_is_a_classifier_rule_only(tiny_package: Path) -> None:
    """A segmentation model's labels name classes of its map, not its last dimension."""
    (tiny_package / "labels.txt").write_text("background\nperson\n")
    with pytest.raises(PackageError, match="2 labels but output"):
        load_package(tiny_package)
    _edit(tiny_package, 'task = "classification"', 'task = "segmentation"')
    assert load_package(tiny_package).labels == ("background", "person")


def test_an_nchw_file_cannot_serve_an_nhwc_input(tiny_package: Path) -> None:
    _edit(tiny_package, 'layout = "NCHW"', 'layout = "NHWC"')
    _edit(tiny_package, "shape = [-1, 3, 8, 8]", "shape = [-1, 8, 8, 3]")
    _edit(tiny_package, 'runtime = "onnxruntime"', 'runtime = "onnxruntime"\nlayout = "NCHW"')
    with pytest.raises(PackageError, match="variant.0..layout: an NCHW file cannot serve"):
        load_package(tiny_package)


def test_classification_golden_keeps_the_class_within_top_k() -> None:
    reference = np.array([[0.1, 3.0, 0.2, 0.0], [2.0, 0.0, 0.5, 1.9]], dtype=np.float32)
    record = golden_record("classification", ["logits"], {"logits": reference}, top_k=2)
    assert record["top1"].tolist() == [1, 0]
    assert record["topk"].tolist() == [[1, 2], [0, 3]]
    shuffled = np.array([[0.1, 2.0, 3.0, 0.0], [2.0, 0.0, 0.5, 1.9]], dtype=np.float32)
    assert golden_problem("classification", ["logits"], record, {"logits": shuffled}, 2) == ""
    assert "1 of 2 golden inputs lost their expected class from the top 1" in golden_problem(
        "classification", ["logits"], record, {"logits": shuffled}, 1
    )


@pytest.mark.parametrize("task", ["detection", "segmentation", "tensor"])
def test_tensor_tasks_compare_outputs_within_the_recorded_tolerance(task: str) -> None:
    names = ["boxes", "scores"]
    reference = {"boxes": np.ones((2, 4, 4), np.float32), "scores": np.zeros((2, 4), np.float32)}
    record = golden_record(task, names, reference, atol=0.01, rtol=0.0)
    assert float(record["atol"]) == 0.01
    close = {"boxes": reference["boxes"] + 0.009, "scores": reference["scores"]}
    assert golden_problem(task, names, record, close) == ""
    far = {"boxes": reference["boxes"], "scores": reference["scores"] + 0.02}
    assert "output 'scores' is 0.02 from the golden answer" in golden_problem(
        task, names, record, far
    )
    wrong_shape = {"boxes": reference["boxes"][:, :2], "scores": reference["scores"]}
    assert "has shape (2, 2, 4)" in golden_problem(task, names, record, wrong_shape)
    nan = {"boxes": reference["boxes"] * np.nan, "scores": reference["scores"]}
    assert "NaN" in golden_problem(task, names, record, nan)


def test_a_tensor_golden_without_tolerance_is_a_problem() -> None:
    record = {"expected_0": np.zeros(3, np.float32)}
    assert "lacks atol/rtol" in golden_problem("tensor", ["y"], record, {"y": np.zeros(3)})
