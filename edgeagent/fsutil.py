"""Durable file replacement, written once for every part of the agent.

A power cut on an edge board can come at any instant. Every record the agent keeps (probe cache,
trust store, update store, reports, keys) is therefore replaced the same way: write a temporary
file beside the target, fsync it, rename it over the target, fsync the directory. On any failure
the temporary file is removed and the target keeps its old content.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside ``path`` durable (the entry lives in the directory)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Make a file's data durable (before a rename publishes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory below ``root`` (bottom-up), so a rename publishes data."""
    for directory, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                fsync_file(Path(path))
        fsync_dir(Path(directory))


def _write_and_close(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, fsync it, close it (closed even when writing fails)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync the directory.

    The temp file is created with ``mode`` from the start (a private key is never readable by
    others, not even for an instant). On any failure it is removed and ``path`` is unchanged.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        _write_and_close(fd, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """``write_file_atomic`` for UTF-8 text."""
    write_file_atomic(path, text.encode("utf-8"), mode)


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` as indented, key-sorted JSON (diffable, reproducible)."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True), mode)


def create_file_exclusive(path: Path, data: bytes, mode: int = 0o600) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True when this call created it.

    The data is written and fsynced under a temporary name (O_EXCL, ``mode`` from the start),
    then hard-linked to ``path``, which fails if ``path`` exists: two processes racing get one
    winner, and nobody ever sees a half-written file (a private key read while being written).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        _write_and_close(fd, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


class SecretFileError(OSError):
    """A key file that cannot be read, or that users other than its owner could read."""


def read_secret_file(path: Path) -> bytes:
    """The bytes of a private-key file, refused when group or others have any access to it.

    Why refuse rather than warn: a key others could read may already be copied, and a daemon
    that starts anyway hides that from the operator.
    """
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise SecretFileError(f"{path}: cannot read the key ({exc.strerror})") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretFileError(
            f"{path}: the key is accessible to other users (mode {stat.S_IMODE(mode):o}); "
            f"run chmod 600 {path}"
        )
    return data


class NotARegularFile(OSError):
    """A path that ``read_regular_file`` refuses: a link, a FIFO, a device, or too large."""


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; NotARegularFile else.

    For records the agent wrote itself (always by rename, so always a plain file): a link put in
    their place is refused rather than followed (``O_NOFOLLOW``: a link to ``/dev/zero`` would
    be read for ever), a FIFO is refused rather than waited on (``O_NONBLOCK``, then ``fstat``:
    a reader would block until someone writes, stalling the daemon's start), and a file larger
    than any record is refused before it is read. A missing file is FileNotFoundError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(f"{path} is a symbolic link, not a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"{path} is not a regular file (mode {info.st_mode:o})")
        if info.st_size > limit:
            raise NotARegularFile(f"{path} holds {info.st_size} bytes, more than {limit}")
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:  # it grew after fstat
        raise NotARegularFile(f"{path} holds more than {limit} bytes")
    return b"".join(chunks)
