"""Sensors that are commands (Raspberry Pi ``vcgencmd``): run with a time-out, never a shell."""

from __future__ import annotations

import shlex
import subprocess

from edgeagent.governor.sysfs import SensorOffline


def run_command(command: str, timeout_s: float) -> str:
    """The command's standard output; SensorOffline when it is missing, fails or hangs."""
    argv = shlex.split(command)
    if not argv:
        raise SensorOffline("no command configured")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SensorOffline(f"{argv[0]}: command not found") from None
    except PermissionError:
        raise SensorOffline(f"{argv[0]}: permission denied") from None
    except subprocess.TimeoutExpired:
        raise SensorOffline(f"{command!r} did not answer within {timeout_s:g} s") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        why = detail[-1] if detail else f"exit status {done.returncode}"
        raise SensorOffline(f"{command!r} failed: {why}")
    return done.stdout
