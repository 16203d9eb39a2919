"""``edgeagent package student.py:make --distil-from TEACHER``: a student taught by a package.

The teacher is the zoo's digits package, run by onnxruntime; the student a small CNN trained
from scratch in .venv-build. Every training row is marked unlabelled (-1), so whatever the
student learns it learns from the teacher's outputs alone: chance is 10 %, and the test asks
for far more agreement with the teacher than that. Refusals are checked before any training,
in the test's own Python (no torch needed to say no).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgeagent.cli import main
from edgeagent.models.package import load_package
from tests.support.helpers import REPO

BUILD_PYTHON = REPO / ".venv-build" / "bin" / "python"
TEACHER = REPO / "zoo" / "digits_mnv3"
STUDENT = f"{REPO / 'tests' / 'support' / 'tiny_student.py'}:make"
PREPROCESS = ["--input-size", "32,32", "--channels", "1", "--mean", "0.5", "--std", "0.5"]


def _splits(root: Path) -> tuple[Path, Path]:
    """The teacher's held-out digits, split: 240 rows to train on (labels withheld), the rest
    to judge with their labels."""
    with np.load(TEACHER / "heldout.npz") as data:
        inputs, labels = data["inputs"], data["labels"]
    train, heldout = root / "train.npz", root / "heldout.npz"
    np.savez(train, inputs=inputs[:240], labels=np.full(240, -1, np.int64))
    np.savez(heldout, inputs=inputs[240:], labels=labels[240:])
    return train, heldout


@pytest.mark.slow
@pytest.mark.skipif(not BUILD_PYTHON.exists(), reason="no .venv-build (torch) in this checkout")
def test_a_student_learns_the_teachers_answers_from_its_outputs_alone(tmp_path: Path) -> None:
    train, heldout = _splits(tmp_path)
    out = tmp_path / "student"
    command = [str(BUILD_PYTHON), "-m", "edgeagent.cli", "package", STUDENT, "--out", str(out)]
    command += ["--distil-from", str(TEACHER), "--distil-epochs", "10", *PREPROCESS]
    command += ["--calibration", str(train), "--heldout", str(heldout), "--max-images", "1000"]
    command += ["--labels", str(TEACHER / "labels.txt"), "--variants", "graph", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((out / "validation.json").read_text())["distillation"]
    assert figures["teacher"] == "digits_mnv3 1.0.0"
    assert (figures["rows"], figures["labelled"], figures["epochs"]) == (240, 0, 10)
    assert figures["agreement"] >= 40.0, figures  # chance: 10 %
    assert figures["teacher_accuracy"] > 90.0 and figures["accuracy"] >= 35.0
    assert figures["parameters"] < 20_000 and figures["speedup"] > 0
    package = load_package(out)
    assert package.variant("onnxruntime", "fp32") is not None
    assert package.labels == load_package(TEACHER).labels


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--distil-epochs", "3"], "--distil-epochs trains a student: add --distil-from"),
        (["--distil-from", "TEACHER"], "--distil-epochs N"),
        (["--distil-from", "TEACHER", "--distil-epochs", "2"], "pass --calibration"),
        (["--distil-from", "NOWHERE", "--distil-epochs", "2", "--calibration", "T"], "NOWHERE"),
        (["--distil-from", "TEACHER", "--distil-epochs", "2", "--prune", "0.3"], "--prune"),
    ],
)
def test_a_distillation_that_cannot_work_is_refused_before_any_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    flags = [str(TEACHER) if f == "TEACHER" else str(tmp_path / f) if f in ("NOWHERE", "T") else f
             for f in flags]  # fmt: skip
    out = tmp_path / "out"
    assert main(["package", STUDENT, "--out", str(out), *PREPROCESS, *flags]) != 0
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_only_a_pytorch_source_can_be_a_student(tmp_path: Path, capsys) -> None:
    onnx_source = str(TEACHER / "digits_mnv3.fp32.onnx")
    command = ["package", onnx_source, "--out", str(tmp_path / "out"), "--distil-from"]
    command += [str(TEACHER), "--distil-epochs", "2", "--calibration", str(tmp_path)]
    assert main(command) != 0
    assert "the source must be one file.py:factory" in capsys.readouterr().err
