"""PyTorch sources: ``file.py:factory`` + weights exported to ONNX, packaged, answering as torch.

Torch lives only in the build environment (.venv-build); the export runs there in a process of
its own, and the package it leads to is validated and served from the agent's environment.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from tests.support.helpers import REPO

BUILD_PYTHON = REPO / ".venv-build" / "bin" / "python"

NET = """
import torch
from torch import nn

def make():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    )
"""

# Runs in .venv-build: seeded weights saved as a state_dict, and torch's own answers.
REFERENCE = """
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
import net
torch.manual_seed(0)
model = net.make().eval()
torch.save(model.state_dict(), sys.argv[2])
x = np.random.default_rng(1).standard_normal((5, 3, 16, 16)).astype(np.float32)
with torch.no_grad():
    np.savez(sys.argv[3], inputs=x, outputs=model(torch.from_numpy(x)).numpy())
"""

# Runs in .venv-build: the in-process path of `edgeagent package file.py:factory`.
IN_PROCESS = """
import sys
from pathlib import Path
from edgeagent.packaging.build import build_package
from edgeagent.packaging.options import PackageOptions
options = PackageOptions(name="net", task="classification", input_size=(16, 16),
                         weights=Path(sys.argv[2]), variants=("graph", "openvino"))
build_package([sys.argv[1]], Path(sys.argv[3]), options, lambda line: print(line))
"""


@pytest.fixture(scope="module")
def torch_net(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not BUILD_PYTHON.exists():
        pytest.skip(f"{BUILD_PYTHON} missing: the PyTorch path needs the build environment")
    tmp = tmp_path_factory.mktemp("torch")
    (tmp / "net.py").write_text(NET)
    paths = {"dir": tmp, "net": tmp / "net.py", "weights": tmp / "net.pt", "ref": tmp / "ref.npz"}
    run = [str(BUILD_PYTHON), "-c", textwrap.dedent(REFERENCE), str(tmp)]
    subprocess.run([*run, str(paths["weights"]), str(paths["ref"])], check=True, cwd=REPO)
    return paths


def _torch_answers(paths: dict[str, Path]) -> tuple[np.ndarray, np.ndarray]:
    with np.load(paths["ref"]) as data:
        return data["inputs"], data["outputs"]


def test_factory_source_exports_in_process(torch_net: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    subprocess.run(
        [
            str(BUILD_PYTHON),
            "-c",
            textwrap.dedent(IN_PROCESS),
            f"{torch_net['net']}:make",
            str(torch_net["weights"]),
            str(out),
        ],
        check=True,
        cwd=REPO,
    )
    package = load_package(out)
    assert package.inputs[0].shape == (-1, 3, 16, 16)  # the dynamic batch survived the export
    assert sorted(v.key for v in package.variants) == ["onnxruntime/fp32", "openvino/fp32"]
    inputs, expected = _torch_answers(torch_net)
    for variant in package.variants:
        session = open_variant(package, variant.runtime, variant.precision, threads=1)
        answer = session.run({"input": inputs})["output"]
        session.close()
        np.testing.assert_allclose(answer, expected, rtol=1e-4, atol=1e-5, err_msg=variant.key)


def test_factory_errors_name_the_file(torch_net: dict[str, Path], tmp_path: Path) -> None:
    """``python -m edgeagent.packaging.torch_export``, the path for an agent env without torch."""
    done = subprocess.run(
        [
            str(BUILD_PYTHON),
            "-m",
            "edgeagent.packaging.torch_export",
            f"{torch_net['net']}:nope",
            "--input-size",
            "16,16",
            "--out",
            str(tmp_path / "x.onnx"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert f"{torch_net['net']}: has no callable 'nope'" in done.stderr
