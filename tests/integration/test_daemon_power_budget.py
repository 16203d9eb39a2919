"""`[hardware] choice = "fastest"` keeps to the profile's power budget in the daemon.

The daemon hands the hardware chooser the governor's power sensors. Here the board's PMIC is a
command that reports 9 W while the first candidate is timed and 2 W for the second, under a
5 W budget: the second candidate must serve, whichever of the two is quicker.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from tests.support.hardware import FIXTURES, write_multi_package, write_profile

ORT = "onnxruntime:CPUExecutionProvider:fp32"
OV = "openvino:CPU:fp32"

# Watts per call of the fake `vcgencmd pmic_read_adc`: the chooser reads once before and once
# after timing each candidate, in ranking order (ORT, then OV).
PMIC = """\
import pathlib, sys
counter = pathlib.Path(sys.argv[1])
calls = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(calls + 1))
watts = [9.0, 9.0, 2.0, 2.0][min(calls, 3)]
print(f" EXT5V_A current(0)={watts}A")
print(" EXT5V_V volt(0)=1.0V")
"""


@pytest.fixture
async def daemon(tmp_path: Path):
    profile = write_profile(tmp_path / "profiles", "metered", [ORT, OV])
    with profile.open("a") as toml:
        toml.write(
            '[power]\nbudget_w = 5.0\n[[power.sensor]]\nkind = "vcgencmd_pmic"\nname = "all"\n'
            "total = true\n"
        )
    write_multi_package(
        tmp_path / "models" / "tiny", [("onnxruntime", "fp32"), ("openvino", "fp32")]
    )
    script = tmp_path / "pmic.py"
    script.write_text(PMIC)
    config = parse_config(
        f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{tmp_path / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
        f"[hardware]\nroot = '{FIXTURES / 'generic-x86_64'}'\n"
        f"profiles_dir = '{tmp_path / 'profiles'}'\nprofile = 'metered'\n"
        "choice = 'fastest'\nfastest_seconds = 0.05\n"
        f"[governor]\nenabled = false\n"
        f"pmic_command = '{sys.executable} {script} {tmp_path / 'pmic-calls'}'\n"
    )
    daemon = Daemon(config)
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


async def test_fastest_in_the_daemon_skips_the_candidate_over_the_power_budget(daemon):
    report = daemon.status()["profile"]["models"]["tiny:1"]
    assert report["choice"]["reason"].startswith("fastest within 5 W of 2 timed")
    assert report["active"]["candidate"] == OV
