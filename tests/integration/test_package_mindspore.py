"""A MindSpore network packaged with ``edgeagent package`` and served, against MindSpore itself.

LeNet-5 (scripts/mindspore/lenet.py) trained on the digits data in set-up
(scripts/mindspore_lenet.sh, cached in zoo/lenet_mindspore): packaged from its ``nn.Cell``
module and ``.ckpt`` with MindSpore's own ONNX exporter in .venv-ms; the served logits for the
held-out digits must be MindSpore's own (recorded by its trainer), within fp32 tolerance.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from devtools.agent_process import RunningDaemon, running_daemon
from devtools.zoo import zoo_dir
from edgeagent.cli import main
from edgeagent.models.package import load_package
from tests.support.helpers import REPO

CELL = REPO / "scripts" / "mindspore" / "lenet.py"
ROWS = 64  # held-out digits sent to the daemon


@pytest.fixture(scope="module")
def trained() -> Path:
    path = zoo_dir() / "lenet_mindspore"
    if not (path / "lenet.ckpt").is_file():
        pytest.fail(f"{path} not found: run scripts/setup.sh (its step 'MindSpore LeNet-5')")
    return path


@pytest.fixture(scope="module")
def built(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mindspore")
    labels = root / "digits.txt"
    labels.write_text("".join(f"{d}\n" for d in range(10)))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(
            [
                "package", f"{CELL}:LeNet5", "--weights", str(trained / "lenet.ckpt"),
                "--input-size", "32,32", "--channels", "1", "--labels", str(labels),
                "--heldout", str(trained / "heldout.npz"), "--variants", "graph",
                "--name", "lenet", "--out", str(root / "models" / "lenet"), "--threads", "1",
                "--json",
            ]
        )  # fmt: skip
    assert code == 0, stdout.getvalue()
    return root


@pytest.fixture(scope="module")
def daemon(built: Path) -> Iterator[RunningDaemon]:
    with running_daemon(built) as running:
        yield running


def test_the_export_is_held_to_mindspore_itself(built: Path) -> None:
    package = load_package(built / "models" / "lenet")
    assert [(t.name, t.shape) for t in package.inputs] == [("input", (-1, 1, 32, 32))]
    report = json.loads((built / "models" / "lenet" / "validation.json").read_text())
    assert report["framework"]["framework"] == "mindspore"
    assert report["framework"]["rows"] > 0
    assert report["framework"]["max_relative_error"] <= 1e-4


def test_served_logits_are_mindspores_own(trained: Path, daemon: RunningDaemon) -> None:
    with (
        np.load(trained / "heldout.npz") as held,
        np.load(trained / "mindspore_outputs.npz") as own,
    ):
        inputs, labels, logits = held["inputs"][:ROWS], held["labels"][:ROWS], own["logits"][:ROWS]
    served = []
    for start in range(0, ROWS, 8):  # the package's max_batch_size
        batch = inputs[start : start + 8]
        body = {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(batch.shape),
                    "datatype": "FP32",
                    "data": batch.ravel().tolist(),
                }
            ]
        }
        answer = requests.post(
            f"{daemon.url}/v2/models/lenet/infer", json=body, headers=daemon.headers, timeout=30
        )
        assert answer.status_code == 200, answer.text
        output = answer.json()["outputs"][0]
        served.append(np.asarray(output["data"], np.float32).reshape(output["shape"]))
    got = np.concatenate(served)
    np.testing.assert_allclose(got, logits, rtol=1e-4, atol=1e-4 * np.abs(logits).max())
    assert np.mean(got.argmax(1) == labels) > 0.9  # a trained network, not noise


def test_a_missing_mindspore_environment_names_the_set_up_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeagent.packaging.mindspore_source import mindspore_python

    monkeypatch.setenv("EDGEAGENT_MINDSPORE_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(ValueError, match="no such file"):
        mindspore_python()
    monkeypatch.delenv("EDGEAGENT_MINDSPORE_PYTHON")
    with pytest.raises(ValueError, match=r"scripts/setup\.sh .*\.venv-ms"):
        mindspore_python(tmp_path / "no-venv" / "python")
