"""The state-format file read as hostile bytes: every content ends in an answer.

``run`` and ``agent-update check-state`` (which the update worker waits on) read
``state-format.json`` first. A file nested 100,000 deep, a link to ``/dev/zero`` or a FIFO in
its place used to end in a traceback, an unbounded read, or a reader waiting for ever; each is
now refused with a message naming the file, as a bad format number is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeagent.cli import main as cli
from edgeagent.selfupdate.stateformat import (
    FORMAT_FILE,
    FORMAT_FILE_MAX_BYTES,
    Declared,
    StateFormatError,
    read_declared,
)
from tests.support.helpers import REPO


def _deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def _deep_but_small(path: Path) -> None:
    path.write_text("[" * 20_000 + "]" * 20_000)  # within the size bound: the parser's depth


def _to_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _link_to_a_good_file(path: Path) -> None:
    good = path.parent / "elsewhere.json"
    good.write_text('{"format": 1}')
    path.symlink_to(good)


def _directory(path: Path) -> None:
    path.mkdir()


def _not_utf8(path: Path) -> None:
    path.write_bytes(b'{"format": 1, "written_by": "\xff"}')


def _huge(path: Path) -> None:
    path.write_text('{"format": 1, "pad": "' + "x" * FORMAT_FILE_MAX_BYTES + '"}')


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_deep, f"holds 200000 bytes, more than {FORMAT_FILE_MAX_BYTES}"),
        (_deep_but_small, "unreadable (nested too deeply)"),
        (_to_dev_zero, "is a symbolic link, not a regular file"),
        (_link_to_a_good_file, "is a symbolic link, not a regular file"),
        (_directory, "is not a regular file"),
        (_not_utf8, "unreadable ("),
        (_huge, f"more than {FORMAT_FILE_MAX_BYTES}"),
    ],
)
def test_a_hostile_format_file_is_refused_by_check_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], None], message: str
) -> None:
    make(tmp_path / FORMAT_FILE)
    with pytest.raises(StateFormatError) as refused:
        read_declared(tmp_path)
    assert message in str(refused.value) and str(tmp_path / FORMAT_FILE) in str(refused.value)
    assert cli(["agent-update", "check-state", "--state-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """As a process (a reader blocked on a FIFO cannot be interrupted in-process): the
    timeout only guards the suite; the answer comes at once."""
    os.mkfifo(tmp_path / FORMAT_FILE)
    result = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "agent-update", "check-state",
         "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 2
    assert "is not a regular file" in result.stderr and "Traceback" not in result.stderr


def test_a_good_file_is_read(tmp_path: Path) -> None:
    """The control: the file the agent writes is read as before."""
    (tmp_path / FORMAT_FILE).write_text('{"format": 1, "written_by": "0.1.0"}')
    assert read_declared(tmp_path) == Declared(1, "0.1.0")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=st.binary(max_size=256) | _json.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_are_a_format_or_a_refusal(tmp_path: Path, content: bytes) -> None:
    (tmp_path / FORMAT_FILE).write_bytes(content)
    try:
        found = read_declared(tmp_path)
    except StateFormatError as exc:
        assert str(tmp_path / FORMAT_FILE) in str(exc)
    else:
        assert isinstance(found.format, int) and found.format >= 1
