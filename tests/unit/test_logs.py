"""Log plumbing: every line of a record is stamped; native fd-2 output becomes records."""

from __future__ import annotations

import logging
import os
import sys
import threading

import pytest

from edgeagent import logs


def test_every_line_of_a_traceback_carries_time_level_and_logger() -> None:
    formatter = logs.EveryLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        raise ValueError("broken\nacross two lines")
    except ValueError:
        record = logging.LogRecord(
            "edgeagent.x", logging.ERROR, __file__, 1, "died", None, sys.exc_info()
        )
    lines = formatter.format(record).splitlines()
    assert len(lines) > 3
    header = lines[0][: -len("died")]
    assert header.endswith(" ERROR edgeagent.x: ")
    assert all(line.startswith(header) for line in lines)
    assert lines[1] == header + "Traceback (most recent call last):"
    assert lines[-1] == header + "across two lines"


@pytest.fixture
def capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    """native_output as ``logs.configure`` leaves it (pytest's handlers never write to fd 2)."""
    monkeypatch.setattr(logs._capture, "enabled", True)


def _fd2() -> tuple[int, int]:
    found = os.fstat(2)
    return found.st_dev, found.st_ino


def test_native_lines_become_records_and_fd2_is_restored(
    capturing: None, caplog: pytest.LogCaptureFixture
) -> None:
    before = _fd2()
    with caplog.at_level(logging.DEBUG, logger=logs.NATIVE_LOGGER), logs.native_output("litert"):
        assert _fd2() != before  # a pipe while the model loads
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
        os.write(2, b"ERROR: Didn't find op for builtin opcode 'GELU'\n\nno newline")
    assert _fd2() == before  # the request path writes to the real standard error again
    relayed = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert relayed == [
        (
            "edgeagent.native.litert",
            logging.DEBUG,
            "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
        ),
        (
            "edgeagent.native.litert",
            logging.WARNING,
            "ERROR: Didn't find op for builtin opcode 'GELU'",
        ),
        ("edgeagent.native.litert", logging.DEBUG, "no newline"),
    ]


def test_overlapping_loads_share_one_pipe_and_log_under_the_family(
    capturing: None, caplog: pytest.LogCaptureFixture
) -> None:
    before = _fd2()
    inside, release = threading.Event(), threading.Event()

    def other_load() -> None:
        with logs.native_output("onnxruntime"):
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other_load)
    with caplog.at_level(logging.DEBUG, logger=logs.NATIVE_LOGGER), logs.native_output("litert"):
        thread.start()
        assert inside.wait(10)
        os.write(2, b"[W:onnxruntime:, session_state.cc:1] or was it litert?\n")
        release.set()
        thread.join(10)
        assert _fd2() != before  # still captured: this load has not ended
    assert _fd2() == before
    assert [(r.name, r.levelno) for r in caplog.records] == [("edgeagent.native", logging.WARNING)]


def test_without_configure_native_output_leaves_fd2_alone() -> None:
    before = _fd2()
    with logs.native_output("litert"):
        assert _fd2() == before
