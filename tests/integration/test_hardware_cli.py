"""`edgeagent profile` as a user runs it: a real process, real runtimes, fixture boards, the zoo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hardware import FIXTURES, write_multi_package
from tests.support.helpers import REPO


def _profile(*args: str, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "profile", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )


@pytest.fixture
def models(tmp_path: Path) -> Path:
    write_multi_package(
        tmp_path / "models" / "tiny",
        [("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("openvino", "int8")],
    )
    (tmp_path / "models" / "broken").mkdir()
    (tmp_path / "models" / "broken" / "model.toml").write_text('name = "broken"\n')
    return tmp_path / "models"


def test_this_machine_explains_every_candidate(tmp_path: Path, models: Path) -> None:
    done = _profile("--models-dir", str(models), "--json", state=tmp_path / "state")
    doc = json.loads(done.stdout)
    assert done.returncode == 1, done.stderr  # the broken package has no choice
    assert doc["profile"].startswith("generic-")  # this container is no known board
    assert "no specific profile matched" in doc["reason"]
    broken, tiny = doc["models"]
    assert "version: missing required field" in broken["error"]
    assert tiny["chosen"] and tiny["median_latency_ms"] > 0
    by_key = {c["candidate"]: c for c in tiny["candidates"]}
    for candidate in by_key.values():
        assert candidate["state"] == "chosen" or candidate["why"], candidate
    if doc["profile"] == "generic-x86_64":
        cuda = by_key["onnxruntime:CUDAExecutionProvider:fp16"]
        assert "no onnxruntime/fp16 variant" in cuda["why"]
        assert "NPU" in by_key["openvino:NPU:int8"]["why"]  # OpenVINO's own error
        assert by_key["openvino:CPU:int8"]["state"] in ("chosen", "kept")


def test_fixture_board_text_report(tmp_path: Path, models: Path) -> None:
    root = FIXTURES / "jetson-orin"
    done = _profile("--root", str(root), "--models-dir", str(models), state=tmp_path / "s")
    text = done.stdout
    assert "profile    jetson-orin" in text
    assert "L4T R36.4.3" in text
    assert "files: etc/nv_tegra_release; compatible: nvidia,tegra234" in text
    assert "model tiny v1: onnxruntime:CPUExecutionProvider:int8" in text
    # onnxruntime's own account of the TensorRT candidate it cannot run here
    assert "TensorrtExecutionProvider in this build" in text
    assert "model broken: invalid package" in text


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[hardware]\nchoice = "random"\n')
    done = _profile("--config", str(config), state=tmp_path / "s")
    assert done.returncode == 2
    assert "[hardware] choice" in done.stderr


def test_every_zoo_model_gets_an_explained_choice(tmp_path: Path, zoo: Path) -> None:
    done = _profile("--models-dir", str(zoo), "--json", "--seconds", "0.3", state=tmp_path / "s")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    names = {m["model"] for m in doc["models"]}
    assert {"mobilenet_v2", "mobilenet_v3_small", "mobilevit_xxs", "digits_mnv3"} <= names
    # The language model is chosen the way the daemon places it: by decoding, ranked by rate.
    (language,) = [m for m in doc["models"] if m["model"] == "smollm2"]
    assert language["mode"] == "generated" and language["chosen"].startswith("llama_cpp:")
    assert language["candidates"][0]["tokens_per_s"] > 0
    for model in doc["models"]:
        assert model["chosen"] and model["median_latency_ms"] > 0, model
        runtimes = {
            c["candidate"].split(":")[0] for c in model["candidates"] if c["state"] != "dropped"
        }
        assert runtimes, model
