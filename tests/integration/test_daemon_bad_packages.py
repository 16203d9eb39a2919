"""One bad package stays one bad package: an unreadable package directory is listed with its
reason while the others serve, and a models directory that does not exist is named as such.

``chmod 000`` stops every user but root, and tests may run as root: then the agent runs as
``nobody`` (setpriv), so the directory really is unreadable to it. What this proves is the
operator's case itself (a package directory the agent's user cannot read), not a simulation.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devtools.agent_process import spawn_agent
from edgeagent.api.client import AgentClient
from tests.support.helpers import REPO, write_tiny_package

NOBODY = 65534


def _as_agent_user() -> list[str]:
    """The command prefix that runs a child as a user whom ``chmod 000`` stops."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: chmod 000 would not stop the agent")
    check = subprocess.run(
        [*prefix, sys.executable, "-c", "import edgeagent"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd="/",
    )
    if check.returncode != 0:
        pytest.skip(f"this interpreter does not run as uid {NOBODY}: {check.stderr[-300:]!r}")
    return prefix


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory the agent's user owns (pytest's tmp_path is private to the test's user),
    inside one only we may write, as /run is for the service: `edgeagent status` trusts an
    agent's directory owned by another user only there (never straight under /tmp)."""
    parent = Path(tempfile.mkdtemp(prefix="edgeagent-bad-packages-"))
    parent.chmod(0o755)
    path = parent / "agent"
    path.mkdir()
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    (path / "agent.toml").write_text("")  # not /etc/edgeagent/agent.toml, whatever it says
    yield path
    for directory in path.rglob("*"):
        if directory.is_dir() and not directory.is_symlink():
            directory.chmod(0o755)  # the unreadable one too, so it can be removed
    shutil.rmtree(parent)


def _run(home: Path, models_dir: Path) -> subprocess.Popen:
    return spawn_agent(
        ["--config", str(home / "agent.toml"), "--models-dir", str(models_dir),
         "--socket", str(home / "agent.sock"), "--port", "0"],
        prefix=_as_agent_user(), state=home / "state",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=home,
    )  # fmt: skip


def test_an_unreadable_package_is_listed_and_the_others_serve(home: Path) -> None:
    write_tiny_package(home / "models" / "tiny")
    broken = write_tiny_package(home / "models" / "broken", name="broken")
    broken.chmod(0)
    agent = _run(home, home / "models")
    assert agent.stdout is not None
    first = agent.stdout.readline()  # announced once it serves (or nothing: it exited)
    if not first.startswith("edgeagent serving"):
        agent.kill()
        pytest.fail(f"the agent did not start: {first}{agent.communicate()[1]}")
    try:
        assert first.strip() == "edgeagent serving tiny 1"
        listed = agent.stdout.readline()
        assert listed.startswith("  broken is UNAVAILABLE: ") and "Permission denied" in listed
        client = AgentClient(socket_path=home / "agent.sock")
        answer = client.infer("tiny", {"input": np.zeros((1, 3, 8, 8), dtype=np.float32)})
        assert answer.outputs["logits"].shape == (1, 4)
        status = subprocess.run(
            [sys.executable, "-m", "edgeagent.cli", "status", "--socket", str(home / "agent.sock")],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"},
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines[2:] if line.startswith(" " * 10)), lines
        assert any(line.split()[:1] == ["broken"] and "UNAVAILABLE" in line for line in lines)
        assert any(line.split()[:2] == ["tiny", "1"] and "READY" in line for line in lines)
        details = " ".join(line.strip() for line in lines)
        assert f"broken: invalid package: {broken / 'model.toml'}: cannot read: " in details
    finally:
        agent.send_signal(signal.SIGTERM)
        _, log = agent.communicate(timeout=60)
    assert agent.returncode == 0, log
    assert "model broken is unavailable" in log and "Permission denied" in log


def test_a_models_dir_that_does_not_exist_is_named(home: Path) -> None:
    missing = home / "no-such-models"
    agent = _run(home, missing)
    assert agent.stdout is not None
    first = agent.stdout.readline()  # before the fix: "edgeagent serving no models"
    if agent.poll() is None:
        agent.kill()
    _, err = agent.communicate(timeout=60)
    assert first == "", first
    assert agent.returncode == 2
    assert f"[agent] models_dir: models directory {missing} does not exist" in err
