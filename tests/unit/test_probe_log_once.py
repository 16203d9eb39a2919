"""An accelerator's failure is logged in full once, not once per model (issue 13)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edgeagent.hardware.choose import Chooser
from edgeagent.hardware.probe import CACHE_FILE, ProbeCache, Prober
from edgeagent.hardware.profile import load_profile
from edgeagent.models.package import load_package
from tests.support.hardware import write_profile
from tests.support.helpers import write_tiny_package

CPU = "onnxruntime:CPUExecutionProvider:fp32"
MISSING = "onnxruntime:NoSuchExecutionProvider:fp32"  # fails the same way for every model


def test_the_same_probe_error_is_said_once_then_referred_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profile = load_profile(write_profile(tmp_path, "p", [MISSING, CPU]))
    prober = Prober(
        ProbeCache(tmp_path / CACHE_FILE),
        threads=1,
        compiled_dir=tmp_path / "compiled",
        timeout_s=60.0,
        failure_ttl_s=3600.0,
    )
    chooser = Chooser(prober)
    caplog.set_level(logging.INFO, logger="edgeagent.hardware.probe")
    for name in ("first", "second", "third"):
        package = load_package(write_tiny_package(tmp_path / name, name=name))
        chooser.choose(profile, package).session.close()
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 3
    assert "NoSuchExecutionProvider" in dropped[0].split("dropped", 1)[1]  # the full error once
    assert dropped[1].endswith("dropped (the same error as for first)")
    assert dropped[2].endswith("dropped (the same error as for first)")
