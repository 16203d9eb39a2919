"""Fixtures every test may use (a tiny real model package, the built zoo), and the session
hook that keeps the tests from modifying tracked files (tests/support/tree.py)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.helpers import write_tiny_package, zoo_dir
from tests.support.tree import changed_by_run, tracked_state

# Property tests check what a parser answers, never how fast: Hypothesis's default 200 ms
# deadline per example (and its too_slow health check) turn a busy 2-core CI machine into
# failures that no code change caused. Tests that set their own settings still override these.
settings.register_profile("edgeagent", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("edgeagent")


@pytest.fixture(autouse=True)
def _root_log_level() -> Iterator[None]:
    """Put the root logger's level back after each test: ``edgeagent run`` and the daemon's
    reload set it from the config, and run in-process that leaked into later tests, whose
    ``caplog`` then saw no warnings (test_sdnotify, only in a whole-suite order)."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.fixture
def tiny_package(tmp_path: Path) -> Path:
    return write_tiny_package(tmp_path / "tiny")


@pytest.fixture(scope="session")
def zoo() -> Path:
    """The zoo built by scripts/build_models.py; the test command builds it before pytest."""
    path = zoo_dir()
    if not (path / "mobilenet_v2" / "model.toml").is_file():
        pytest.fail(f"model zoo not found at {path}: run scripts/setup.sh (it builds the zoo)")
    return path


REPO = Path(__file__).resolve().parents[1]
_TREE_BEFORE: dict[str, str] | None = None


def _check_tree() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("EDGEAGENT_CHECK_TREE") == "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    global _TREE_BEFORE
    if _check_tree():
        _TREE_BEFORE = tracked_state(REPO)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a test changed a tracked file (the list says which)."""
    if _TREE_BEFORE is None:
        return
    after = tracked_state(REPO)
    changed = changed_by_run(_TREE_BEFORE, after or {})
    if changed:
        sys.stderr.write(
            "\nthe tests modified tracked files (write to tmp_path instead): "
            + ", ".join(changed)
            + "\n"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
