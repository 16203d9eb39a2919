"""``edgeagent package file.py:factory --prune``: channels removed, judged by task and speed.

A small CNN trained on the digits in .venv-build (torch, torch-pruning) is packaged with
``--prune 0.25 --prune-epochs 2`` (fine-tuned on the training split given as --calibration).
Whether the pruned network is kept depends on this machine's timing, which a test may not
assert; what it asserts is the rule: the package's network has the pruned channel count exactly
when validation.json says the ratio was kept, and kept means within the top-1 drop and faster.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from edgeagent.models.package import load_package
from edgeagent.packaging.pruning import MIN_SPEEDUP
from tests.support.helpers import REPO

BUILD_PYTHON = REPO / ".venv-build" / "bin" / "python"

NET = """
from torch import nn

def make():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )
"""

# Runs in .venv-build: the digits at 16×16, a few epochs, the weights and both splits.
TRAIN = """
import sys
from pathlib import Path
import numpy as np, torch
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import net
from modelbuild.data import digits_split
from modelbuild.train import train_classifier
out = Path(sys.argv[1])
split = digits_split(16)
def nchw(images):
    return np.ascontiguousarray((images.astype(np.float32) / 255.0).transpose(0, 3, 1, 2))
torch.manual_seed(0)
model = net.make()
train_classifier(model, torch.from_numpy(nchw(split.train_images)),
                 torch.from_numpy(split.train_labels), epochs=3, batch_size=64, lr=3e-3,
                 seed=0, max_shift=1)
torch.save(model.state_dict(), out / "net.pt")
np.savez(out / "train.npz", inputs=nchw(split.train_images)[:400],
         labels=split.train_labels[:400])
np.savez(out / "heldout.npz", inputs=nchw(split.heldout_images), labels=split.heldout_labels)
"""


def _build(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BUILD_PYTHON), "-m", "edgeagent.cli", "package", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not BUILD_PYTHON.exists():
        pytest.fail(f"{BUILD_PYTHON} not found: run scripts/setup.sh (it makes .venv-build)")
    root = tmp_path_factory.mktemp("prune")
    (root / "net.py").write_text(textwrap.dedent(NET))
    subprocess.run(
        [str(BUILD_PYTHON), "-c", TRAIN, str(root), str(REPO / "scripts")],
        check=True,
        capture_output=True,
    )
    (root / "digits.txt").write_text("".join(f"{d}\n" for d in range(10)))
    done = _build(
        f"{root / 'net.py'}:make", "--weights", str(root / "net.pt"), "--input-size", "16,16",
        "--channels", "1", "--labels", str(root / "digits.txt"),
        "--heldout", str(root / "heldout.npz"), "--calibration", str(root / "train.npz"),
        "--prune", "0.25", "--prune-epochs", "2", "--max-top1-drop", "5", "--variants", "graph",
        "--threads", "1",
        "--out", str(root / "net"), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root


def _conv_channels(path: Path) -> list[int]:
    model = onnx.load(str(path))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    convolutions = [n for n in model.graph.node if n.op_type in ("Conv", "FusedConv")]
    return [int(weights[n.input[1]].shape[0]) for n in convolutions]


def test_the_package_holds_the_pruned_network_exactly_when_it_passed(built: Path) -> None:
    report = json.loads((built / "net" / "validation.json").read_text())
    (figure,) = report["pruning"]
    assert figure["ratio"] == 0.25
    assert figure["parameters"] < 0.7 * 56_000  # 3/4 of the channels: ~9/16 of the weights
    base = figure["unpruned_accuracy"]
    assert base > 80  # a trained network: the accuracy rule means something
    passes = base - figure["accuracy"] <= 5.0 and figure["speedup"] >= MIN_SPEEDUP
    assert figure["kept"] == passes, figure
    assert bool(figure["reason"]) != passes
    package = load_package(built / "net")
    (variant,) = package.variants
    channels = _conv_channels(variant.files[0])
    if figure["kept"]:  # every convolution lost about a quarter of its channels
        assert all(0.6 < c / full < 0.9 for c, full in zip(channels, [32, 64, 64], strict=True))
    else:
        assert channels == [32, 64, 64]


def test_pruning_is_refused_where_it_cannot_work(built: Path, tmp_path: Path) -> None:
    onnx_source = next((built / "net").glob("*.onnx"))
    done = _build(str(onnx_source), "--prune", "0.3", "--out", str(tmp_path / "a"))
    assert done.returncode == 2 and "PyTorch sources" in done.stderr
    assert "Traceback" not in done.stderr
    common = [f"{built / 'net.py'}:make", "--weights", str(built / "net.pt")]
    common += ["--input-size", "16,16", "--channels", "1", "--variants", "graph"]
    done = _build(*common, "--prune", "1.5", "--out", str(tmp_path / "b"))
    assert done.returncode == 2 and "between 0 and 1" in done.stderr
    done = _build(*common, "--prune", "0.3", "--prune-epochs", "1", "--out", str(tmp_path / "c"))
    assert done.returncode == 2 and "--calibration" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing left behind by a refused build
