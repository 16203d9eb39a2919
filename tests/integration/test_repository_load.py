"""Repository load/unload of a live daemon (Triton's explicit model control), over HTTP.

Issue 24: a package copied into the models directory after start answered "unknown model" to
``POST /v2/repository/models/{name}/load`` until a restart. Now ``load`` finds it there, and
``unload`` closes it and hands its memory back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from devtools.agent_process import ADMIN_TOKEN, RunningDaemon, running_daemon
from devtools.tiny import write_tiny_package
from edgeagent.models.manifest_writer import Manifest, VariantFiles, write_manifest
from edgeagent.models.package import TensorSpec

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WIDTH = 4096  # a [4096, 4096] float32 weight: 64 MiB that a loaded session holds


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path) as running:
        yield running


def _infer(daemon: RunningDaemon, name: str, rows: np.ndarray, input_name: str = "input"):
    body = {
        "inputs": [
            {
                "name": input_name,
                "shape": list(rows.shape),
                "datatype": "FP32",
                "data": rows.ravel().tolist(),
            }
        ]
    }
    return requests.post(
        f"{daemon.url}/v2/models/{name}/infer", json=body, headers=daemon.headers, timeout=60
    )


def _repository(daemon: RunningDaemon, name: str, action: str) -> requests.Response:
    return requests.post(
        f"{daemon.url}/v2/repository/models/{name}/{action}", headers=ADMIN, timeout=120
    )


def _rss_kib(daemon: RunningDaemon) -> int:
    status = Path(f"/proc/{daemon.process.pid}/status").read_text(encoding="utf-8")
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))


def _heavy_package(root: Path) -> Path:
    """A tensor model whose one MatMul weighs 64 MiB, so its session's memory shows in RSS."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    root.mkdir(parents=True)
    weight = np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "weight"], ["output"])],
        "heavy",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", WIDTH])],
        [numpy_helper.from_array(weight, "weight")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(root / "heavy.fp32.onnx"))
    write_manifest(
        root,
        Manifest(
            name="heavy",
            version="1",
            task="tensor",
            inputs=(TensorSpec("input", "float32", (-1, WIDTH)),),
            outputs=(TensorSpec("output", "float32", (-1, WIDTH)),),
            variants=(VariantFiles("onnxruntime", "fp32", ("heavy.fp32.onnx",)),),
        ),
    )
    return root


def test_a_package_added_after_start_loads_by_name(daemon: RunningDaemon, tmp_path: Path) -> None:
    rows = np.zeros((1, 3, 8, 8), np.float32)
    missing = _repository(daemon, "second", "load")
    assert missing.status_code == 404 and "unknown model 'second'" in missing.json()["error"]
    write_tiny_package(tmp_path / "models" / "second", name="second", classes=6)
    assert _repository(daemon, "second", "load").status_code == 200
    answer = _infer(daemon, "second", rows)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["shape"] == [1, 6]
    index = requests.post(
        f"{daemon.url}/v2/repository/index", json={}, headers=daemon.headers, timeout=30
    ).json()
    assert {"name": "second", "version": "1", "state": "READY", "reason": ""} in index
    assert _infer(daemon, "tiny", rows).status_code == 200  # the others serve on


def test_a_directory_holding_another_name_is_refused(daemon: RunningDaemon, tmp_path: Path) -> None:
    write_tiny_package(tmp_path / "models" / "alias", name="other")
    refused = _repository(daemon, "alias", "load")
    assert refused.status_code == 500
    assert "the package there is named 'other', not 'alias'" in refused.json()["error"]
    assert _infer(daemon, "other", np.zeros((1, 3, 8, 8), np.float32)).status_code == 404


def test_unload_frees_the_model_and_its_memory(daemon: RunningDaemon, tmp_path: Path) -> None:
    before = _rss_kib(daemon)
    _heavy_package(tmp_path / "models" / "heavy")
    assert _repository(daemon, "heavy", "load").status_code == 200
    rows = np.ones((1, WIDTH), np.float32)
    assert _infer(daemon, "heavy", rows).status_code == 200
    loaded = _rss_kib(daemon)
    assert loaded - before > 48 * 1024  # the 64 MiB weight is resident
    assert _repository(daemon, "heavy", "unload").status_code == 200
    after = _rss_kib(daemon)
    assert loaded - after > 48 * 1024, (before, loaded, after)  # and handed back
    gone = _infer(daemon, "heavy", rows)
    assert gone.status_code == 503 and "unloaded" in gone.json()["error"]
    status = requests.get(f"{daemon.url}/v1/status", headers=daemon.headers, timeout=30).json()
    assert status["models"]["heavy"]["versions"] == {}
    assert _repository(daemon, "heavy", "load").status_code == 200  # and it loads again
    assert _infer(daemon, "heavy", rows).status_code == 200


def test_classify_refuses_a_model_that_is_not_a_classifier(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """Top-k of a tensor model's output answered 200 with output indices as labels."""
    _heavy_package(tmp_path / "models" / "heavy")
    assert _repository(daemon, "heavy", "load").status_code == 200
    refused = requests.post(
        f"{daemon.url}/v1/models/heavy/classify",
        data=b"\xff\xd8not even an image",
        headers={**daemon.headers, "Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert refused.status_code == 400
    assert refused.json()["error"] == (
        "model 'heavy' is a tensor model, not a classifier: use /v2/models/heavy/infer for "
        "its tensors"
    )
