"""The ``edgeagent`` command loads a sub-command's module only when that sub-command runs.

Checked in a fresh interpreter, because this test process has long imported everything.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys

from edgeagent.cli import COMMANDS
from tests.support.helpers import REPO

# Runs main(argv) and reports what it printed and which modules it loaded.
PROBE = """
import contextlib, io, json, sys
from edgeagent.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    try:
        status = main(sys.argv[1:])
    except SystemExit as exit:
        status = exit.code
print(json.dumps({"status": status, "stdout": out.getvalue(), "modules": sorted(sys.modules)}))
"""


def run_cli(*argv: str) -> dict:
    """``edgeagent argv`` in a fresh interpreter that imports this checkout's package."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env=env,
    )
    return json.loads(result.stdout)


def command_modules(modules: list[str]) -> set[str]:
    return {module for module, _ in COMMANDS.values()} & set(modules)


def test_help_lists_every_command_and_imports_none() -> None:
    report = run_cli("--help")
    assert report["status"] == 0
    listing = " ".join(report["stdout"].split())  # argparse wraps long help lines
    for name, (_, summary) in COMMANDS.items():
        assert f"{name} {summary}" in listing
    assert command_modules(report["modules"]) == set()
    assert "numpy" not in report["modules"]


def test_running_one_command_imports_only_its_module() -> None:
    report = run_cli("status", "--socket", str(REPO / "no-such-agent.sock"))
    assert report["status"] == 2  # it ran: the agent is unreachable (an input error)
    assert command_modules(report["modules"]) == {"edgeagent.commands.status"}
    assert "cryptography" not in report["modules"]  # the hub's signing stack
    assert "PIL" not in report["modules"]  # infer's image decoding


def test_each_module_registers_the_help_the_table_shows() -> None:
    for name, (module, summary) in COMMANDS.items():
        parser = argparse.ArgumentParser()
        subparsers = parser.add_subparsers()
        importlib.import_module(module).register(subparsers)
        [registered] = subparsers._choices_actions
        assert (registered.dest, registered.help) == (name, summary)
