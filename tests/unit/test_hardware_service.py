"""The façade the daemon uses: detection at construction, open(), and a JSON-able report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeagent.config import parse_config
from edgeagent.hardware.profile import ProfileError
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.package import load_package
from edgeagent.sections import ConfigError
from tests.support.hardware import FIXTURES, write_multi_package


def test_raspberry_pi_5_end_to_end(tmp_path: Path) -> None:
    package = load_package(
        write_multi_package(tmp_path / "pkg", [("onnxruntime", "fp32"), ("onnxruntime", "int8")])
    )
    acc = Accelerators(HardwareSettings(root=FIXTURES / "raspberry-pi-5"), tmp_path / "state")
    assert acc.profile.name == "raspberry-pi-5"
    assert acc.prober.threads == 4  # the profile's [threads]
    session = acc.open(package)
    assert session.candidate.key == "onnxruntime:CPUExecutionProvider:int8"
    out = session.run({"input": np.zeros((3, 3, 8, 8), np.float32)})
    assert out["logits"].shape == (3, 4)
    report = json.loads(json.dumps(acc.report()))
    assert report["profile"] == "raspberry-pi-5"
    assert "Hailo-8L" in report["accessories"][0]
    assert report["board"]["model"] == "Raspberry Pi 5 Model B Rev 1.0"
    model = report["models"]["tiny:1"]
    assert model["active"]["candidate"] == "onnxruntime:CPUExecutionProvider:int8"
    assert model["choice"]["mode"] == "ranked"
    assert report["runtimes"]["onnxruntime"]["available"] is True
    assert (tmp_path / "state" / "probe-cache.json").is_file()
    session.close()


def test_settings_threads_override_and_forced_profile(tmp_path: Path) -> None:
    settings = HardwareSettings(root=FIXTURES / "jetson-orin", threads=2, profile="coral")
    acc = Accelerators(settings, tmp_path)
    assert acc.profile.name == "coral" and acc.prober.threads == 2
    assert acc.detection.reason == "forced by [hardware] profile"
    with pytest.raises(ProfileError, match="no profile named 'x'"):
        Accelerators(HardwareSettings(profile="x"), tmp_path)


def test_hardware_config_section(tmp_path: Path) -> None:
    config = parse_config(
        f'[hardware]\nroot = "{FIXTURES / "rk3588"}"\nchoice = "fastest"\nfastest_top_k = 2\n'
    )
    assert Accelerators(config.hardware, tmp_path).profile.name == "rk3588"
    for bad, key in [
        ("fastest_top_k = 0", "fastest_top_k"),
        ("probe_golden_agreement = 1.5", "probe_golden_agreement"),
        ("reprobe_backoff_max_s = 1", "reprobe_backoff_max_s"),
        ('choice = "random"', "choice"),
    ]:
        with pytest.raises(ConfigError, match=rf"\[hardware\] {key}"):
            parse_config(f"[hardware]\n{bad}\n")
