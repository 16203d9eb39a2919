"""A socket directory the agent may not write (what `docker run -v /run/edgeagent:…` makes of a
missing host directory: root's, 0755) stops the start with what to do, not a bare EACCES."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.helpers import REPO, write_tiny_package


def test_an_unwritable_socket_directory_says_how_to_fix_it() -> None:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        root.chmod(0o755)
        run = root / "run"
        run.mkdir(mode=0o755)
        state = root / "state"
        state.mkdir()
        state.chmod(0o777)  # the state may be written: only the socket directory may not
        models = write_tiny_package(root / "models" / "tiny").parent
        argv = [sys.executable, "-m", "edgeagent.cli", "run", "--models-dir", str(models),
                "--socket", str(run / "agent.sock"), "--port", "0"]  # fmt: skip
        if os.geteuid() == 0:  # the container case: root's directory, the agent a user
            uid = pwd.getpwnam("nobody").pw_uid
            argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
        else:
            uid = os.geteuid()
            run.chmod(0o555)  # ours, but closed: the same refusal to write
        env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state)}
        result = subprocess.run(
            argv, env=env, cwd=root, capture_output=True, text=True, timeout=120
        )
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert f"cannot create its socket in {run}" in line
    assert f"this agent runs as uid {uid}" in line and f"chown {uid}:" in line
    assert "do not pass --user" in line and "--socket" in line
