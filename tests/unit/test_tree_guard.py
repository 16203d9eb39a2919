"""The guard that keeps tests from modifying tracked files sees each kind of change."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.tree import changed_by_run, tracked_state


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "kept.png").write_bytes(b"picture")
    (tmp_path / "other.txt").write_text("text")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "init")
    return tmp_path


def test_a_clean_run_changes_nothing(repo: Path) -> None:
    before = tracked_state(repo)
    (repo / "untracked.log").write_text("a test's own output")  # not tracked: allowed
    assert before == {} and changed_by_run(before, tracked_state(repo) or {}) == []


def test_rewriting_deleting_and_re_dirtying_tracked_files_are_found(repo: Path) -> None:
    (repo / "other.txt").write_text("a developer's edit before the run")
    before = tracked_state(repo)
    assert before is not None
    (repo / "kept.png").write_bytes(b"a new screenshot")
    (repo / "other.txt").write_text("and the run edits it again")
    assert changed_by_run(before, tracked_state(repo) or {}) == ["kept.png", "other.txt"]
    (repo / "kept.png").unlink()
    assert "kept.png" in changed_by_run(before, tracked_state(repo) or {})


def test_outside_a_checkout_there_is_no_state(tmp_path: Path) -> None:
    assert tracked_state(tmp_path / "not-a-repo") is None
