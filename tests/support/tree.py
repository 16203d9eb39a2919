"""Tests never modify tracked files: the state of the working tree before and after a run.

A test that writes into the checkout (a screenshot into docs/, a rebuilt file beside its
source) leaves a fresh clone dirty and turns the next commit into an accident. The suite's
session hook compares what git reports before and after; only a CI run (or a run that asks
with ``EDGEAGENT_CHECK_TREE=1``) fails on a difference, because on a developer's machine
somebody may be editing the tree while the tests run.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path


def tracked_state(repo: Path) -> dict[str, str] | None:
    """Every tracked file that differs from HEAD (or was deleted), with a hash of its content;
    None where ``repo`` is not a git checkout (a test run from an unpacked sdist)."""
    try:
        listing = subprocess.run(
            ["git", "-C", str(repo), "diff", "--name-only", "-z", "HEAD"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    state = {}
    for name in filter(None, listing.decode().split("\0")):
        path = repo / name
        state[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "-"
    return state


def changed_by_run(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The tracked files whose content the run changed, created back or deleted."""
    return sorted(
        name for name in before.keys() | after.keys() if before.get(name) != after.get(name)
    )
