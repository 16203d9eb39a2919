"""``edgeagent hub server`` without the ``[hub]`` extra (or the ``[s3]`` one for a bucket of
samples) says which pip command installs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO


@pytest.mark.parametrize(
    ("module", "flags", "extra"),
    [
        ("sqlalchemy", [], "hub"),
        ("aiosqlite", [], "hub"),
        ("asyncpg", ["--db", "postgresql://hub@127.0.0.1/hub"], "hub"),
        ("boto3", ["--samples-store", "s3://samples", "--s3-endpoint", "http://127.0.0.1:1"], "s3"),
    ],
)
def test_without_the_hub_extra_it_gives_the_pip_command_and_exits_2(
    tmp_path: Path, module: str, flags: list[str], extra: str
) -> None:
    hidden = tmp_path / "hide"  # first on the path: the import fails as if not installed
    (hidden / module).mkdir(parents=True)
    (hidden / module / "__init__.py").write_text(f"raise ImportError('No module named {module}')\n")
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "edgeagent.cli", "hub", "server", "--state-dir", str(state),
            "--port", "0", "--broker", "127.0.0.1:1"]  # fmt: skip
    result = subprocess.run(
        argv + flags,
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{hidden}{os.pathsep}{REPO}"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"edgeagent hub server: needs {module}" in result.stderr
    assert f"pip install 'edgeagent[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not state.exists()  # refused before anything was made
