"""`infer --socket/--url` leaves the variant to the agent: variant flags are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO


@pytest.mark.parametrize(
    "flags",
    [["--runtime", "openvino"], ["--precision", "int8"], ["--device", "NPU"], ["--threads", "2"]],
)
def test_variant_flags_with_a_remote_agent_are_exit_2_and_say_why(
    tmp_path: Path, flags: list[str]
) -> None:
    image = tmp_path / "x.png"
    image.write_bytes(b"")
    result = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "infer", "tiny", str(image),
         "--url", "http://127.0.0.1:9", *flags],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 2
    assert f"{flags[0]} cannot be used with --socket/--url" in result.stderr
    assert "board profile chose" in result.stderr
