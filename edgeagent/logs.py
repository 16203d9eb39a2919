"""Every line the agent writes to standard error is a log record: time, level and logger.

Three kinds of line would otherwise reach the daemon's log unstamped, so that neither a reader
nor a log parser could tell where they came from or how grave they are: Python warnings raised
inside libraries (Pillow's ``DecompressionBombWarning``), the continuation lines of a
multi-line record (a traceback), and native libraries printing to file descriptor 2 themselves
(LiteRT's ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.``). ``configure`` routes
warnings through logging and stamps every line; ``native_output`` turns what native code prints
while a model loads into records of ``edgeagent.native.<library>``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

NATIVE_LOGGER = "edgeagent.native"
# What a native line says about itself: TFLite's "ERROR:"/"WARNING:", onnxruntime's "[E:" /
# "[W:", glog's "E0123 …", OpenVINO's "[ WARNING ]". Anything else (their INFO chatter) is DEBUG.
_NOTEWORTHY = re.compile(r"\b(?:ERROR|FATAL|WARNING|WARN)\b|\[[EFW]:|^[EFW]\d{4} ")
_CHUNK = 65536  # a native "line" without a newline is relayed in pieces, never refused
_DRAIN_S = 2.0  # how long a load's end waits for its last lines to be relayed


class EveryLineFormatter(logging.Formatter):
    """Repeat the record's time, level and logger on each of its lines.

    The journal stores each line as its own entry and ``grep ERROR`` finds lines, so a traceback
    or a multi-line warning whose later lines carry no header loses its level and its source.
    """

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if "\n" not in text:
            return text
        message, record.message = record.message, ""
        header = self.formatMessage(record)
        record.message = message
        first, *rest = text.splitlines()
        return "\n".join([first, *(header + line for line in rest)])


def configure(level: int, fmt: str) -> None:
    """Log to standard error in ``fmt``, Python warnings included; relay native output.

    Like ``logging.basicConfig`` it leaves a program that already has handlers alone (pytest,
    an application embedding the agent), and then native output is not captured either: its
    handlers may write to fd 2, and a record relayed from fd 2 to fd 2 would loop for ever.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(_private_stderr())
    handler.setFormatter(EveryLineFormatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    _capture.enabled = True


def _private_stderr() -> TextIO:
    """A duplicate of fd 2 for the log handler, so that records keep reaching the terminal or
    the journal while ``native_output`` has fd 2 pointed at its pipe; ``sys.stderr`` itself
    where it is not fd 2 (a test capturing it)."""
    try:
        if sys.stderr.fileno() != 2:
            return sys.stderr
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: no descriptor
        return sys.stderr
    return os.fdopen(
        os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace"
    )


class _Pipe:
    """One redirection of fd 2: the saved descriptor, the relay thread, whose lines they are."""

    def __init__(self, library: str) -> None:
        self.logger_name = f"{NATIVE_LOGGER}.{library}"
        sys.stderr.flush()  # Python's own pending text belongs before the redirection
        read, write = os.pipe()
        self.saved = os.dup(2)
        os.dup2(write, 2)
        os.close(write)
        self.relay = threading.Thread(
            target=self._relay, args=(read,), name="native-stderr", daemon=True
        )
        self.relay.start()

    def add(self, library: str) -> None:
        """Name the records after the library that printed; the family when two loads overlap."""
        named = f"{NATIVE_LOGGER}.{library}"
        self.logger_name = named if self.logger_name == named else NATIVE_LOGGER

    def restore(self) -> None:
        """fd 2 back to where it was; closing the pipe's last write end ends the relay."""
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)

    def _relay(self, read: int) -> None:
        with os.fdopen(read, "rb") as pipe:
            while chunk := pipe.readline(_CHUNK):
                line = chunk.decode("utf-8", "replace").rstrip()
                if line:
                    level = logging.WARNING if _NOTEWORTHY.search(line) else logging.DEBUG
                    logging.getLogger(self.logger_name).log(level, "%s", line)


class _NativeCapture:
    """fd 2 goes to one pipe while at least one load runs (loads run on several threads)."""

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._users = 0
        self._pipe: _Pipe | None = None

    def enter(self, library: str) -> None:
        with self._lock:
            if self._pipe is None:
                self._pipe = _Pipe(library)
            else:
                self._pipe.add(library)
            self._users += 1

    def leave(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users or self._pipe is None:
                return
            pipe, self._pipe = self._pipe, None
            pipe.restore()
        # Bounded: a child process started meanwhile holds the pipe open (its lines are still
        # relayed, later); the load itself must not wait for it.
        pipe.relay.join(_DRAIN_S)


_capture = _NativeCapture()


@contextlib.contextmanager
def native_output(library: str) -> Iterator[None]:
    """Turn what native code prints to fd 2 inside the block into records of
    ``edgeagent.native.<library>`` (DEBUG, or WARNING for its errors and warnings).

    Only around a model's load, where these libraries print (XNNPACK's delegate, a provider
    that fails to initialise): the request path never pays for a redirection. Python text
    written to ``sys.stderr`` by another thread meanwhile is relayed the same way; a native
    crash during a load may lose its last words in the pipe. A no-op until ``configure`` ran.
    """
    if not _capture.enabled:
        yield
        return
    _capture.enter(library)
    try:
        yield
    finally:
        _capture.leave()
