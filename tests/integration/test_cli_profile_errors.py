"""A missing or broken profile directory stops run, infer and profile with exit 2 and one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO, write_tiny_package


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(cwd / "state")},
    )


@pytest.mark.parametrize("broken", ["missing", "unreadable profile"])
@pytest.mark.parametrize("command", ["run", "infer", "profile"])
def test_a_bad_profiles_dir_is_exit_2_with_one_line(
    tmp_path: Path, command: str, broken: str
) -> None:
    profiles = tmp_path / "profiles"
    if broken != "missing":
        profiles.mkdir()
        (profiles / "board.toml").write_text("name = [\n")
    config = tmp_path / "agent.toml"
    config.write_text(f'[hardware]\nprofiles_dir = "{profiles}"\n')
    package = write_tiny_package(tmp_path / "models" / "tiny")
    args = {
        "run": ["run", "--port", "0", "--socket", str(tmp_path / "a.sock"), "--models-dir",
                str(tmp_path / "models")],
        "infer": ["infer", str(package), str(package / "labels.txt")],
        "profile": ["profile", "--models-dir", str(tmp_path / "models")],
    }[command]  # fmt: skip
    result = _cli(*args, "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgeagent {command}: {profiles}"), lines
