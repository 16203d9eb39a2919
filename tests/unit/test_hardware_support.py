"""The flaky plugin and the profile writer of tests/support/hardware.py do what they claim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeagent import runtimes
from edgeagent.hardware.profile import load_profile
from edgeagent.models.package import load_package
from edgeagent.runtimes import InferenceError
from tests.support.hardware import install_flaky, write_profile
from tests.support.helpers import write_tiny_package


def test_flaky_plugin_fails_with_onnxruntimes_own_error(tmp_path: Path, monkeypatch) -> None:
    flaky_onnx = install_flaky(monkeypatch)
    package = load_package(write_tiny_package(tmp_path / "p"))
    flaky_onnx.good_calls = 1
    session = runtimes.get_runtime("onnxruntime").load(
        runtimes.LoadRequest(files=package.variants[0].files)
    )
    batch = np.ones((1, 3, 8, 8), np.float32)
    assert session.run({"input": batch})["logits"].shape == (1, 4)
    with pytest.raises(InferenceError, match="onnxruntime .*(rank|dimension|Invalid)"):
        session.run({"input": batch})


def test_written_profile_is_valid(tmp_path: Path) -> None:
    path = write_profile(tmp_path, "t", ["onnxruntime:CPUExecutionProvider:fp32:low"])
    assert load_profile(path).candidates[0].power == "low"
