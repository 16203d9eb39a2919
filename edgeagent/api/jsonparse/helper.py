"""The daemon's side of the JSON helper process (``helper_process`` says why it exists).

Started at the first large JSON body, not with the daemon, so an agent that is never sent JSON
tensors pays nothing for it (idle RSS). Bodies go to it one at a time. Whenever it cannot help
(no ``memfd_create``, a body over ``[server] json_helper_max_bytes``, a body its fast path does
not take, the process gone or silent), ``parse`` returns None and the caller parses on its own
thread as before, so a request never fails because of the helper; a helper that dies is
started again at the next body, and one that fails to start ``MAX_START_FAILURES`` times in a
row is left off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mmap
import os
import socket
import subprocess
import sys
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeagent.api.jsonparse.helper_process import HEAD

log = logging.getLogger(__name__)

# Room for the doubles of the largest body: a JSON number takes at least two bytes ("0,") and
# becomes 8, so 4 bytes of doubles per byte of JSON. Shared memory is only resident where
# written, so the regions cost what the largest body seen needs, not this.
TARGET_PER_SOURCE_BYTE = 4
# A parse takes ~3 ms a MB (5.3 ms for 1.8 MB); a helper silent this long is stuck, and is
# stopped.
REPLY_TIMEOUT_S = 10.0
MAX_START_FAILURES = 3
# A reply this small (the message less its float tensors: a few hundred bytes for a typical
# request) is read on the event loop, and its message is cheap to decode there too; a larger
# one (say, an INT64 tensor of 100,000 numbers as a JSON list) is read on the JSON thread.
LIGHT_REPLY_BYTES = 16 * 1024


@dataclass(frozen=True)
class HelperParse:
    """A message parsed by the helper; ``light``: small enough to decode on the event loop."""

    message: dict[str, Any]
    light: bool


class _Channel:
    """One running helper process: its socket, its two shared regions, the process."""

    def __init__(self, max_bytes: int) -> None:
        source_fd = os.memfd_create("edgeagent-json-source")
        target_fd = os.memfd_create("edgeagent-json-target")
        ours, theirs = socket.socketpair()
        try:
            target_bytes = TARGET_PER_SOURCE_BYTE * max_bytes
            os.ftruncate(source_fd, max_bytes)
            os.ftruncate(target_fd, target_bytes)
            self.source = mmap.mmap(source_fd, max_bytes)
            self.target = mmap.mmap(target_fd, target_bytes)
            fds = (theirs.fileno(), source_fd, max_bytes, target_fd, target_bytes)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "edgeagent.api.jsonparse.helper_process", *map(str, fds)],
                pass_fds=(theirs.fileno(), source_fd, target_fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            os.close(source_fd)
            os.close(target_fd)
        self.socket = ours
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def ask(self, data: bytes | memoryview) -> bytes:
        """The helper's reply to one body (empty: not taken)."""
        if self.streams is None:
            self.streams = await asyncio.open_unix_connection(sock=self.socket)
        reader, writer = self.streams
        self.source[: len(data)] = data
        writer.write(HEAD.pack(len(data)))
        (length,) = HEAD.unpack(await reader.readexactly(HEAD.size))
        return await reader.readexactly(length) if length else b""

    def close(self, kill: bool = False) -> None:
        """Stop the process and unmap the regions: closing the channel ends its loop, and
        ``kill`` (or a second of waiting) ends a process that is stuck."""
        with contextlib.suppress(OSError):  # the helper sees EOF now, not when the loop runs
            self.socket.shutdown(socket.SHUT_RDWR)
        if self.streams is not None:
            self.streams[1].close()
        else:
            self.socket.close()
        if kill:
            self.process.kill()
        try:
            self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.source.close()
        self.target.close()


class JsonHelper:
    """Parses large JSON infer bodies in the helper process; see the module docstring."""

    def __init__(self, max_bytes: int, executor: Executor) -> None:
        self.max_bytes = max_bytes
        self._executor = executor  # turns a reply into arrays, off the event loop
        self._channel: _Channel | None = None
        self._lock = asyncio.Lock()
        self._start_failures = 0
        self._closed = False
        self.enabled = max_bytes > 0 and hasattr(os, "memfd_create")

    @property
    def pid(self) -> int | None:
        """The running helper's process id (None before the first body, or after it stopped)."""
        return None if self._channel is None else self._channel.process.pid

    async def parse(self, data: bytes | memoryview) -> HelperParse | None:
        """The JSON object of ``data`` as ``v2.parse_json_object`` would give it (but FP32
        tensors' data already float32), or None when the helper did not take it (the caller
        then parses it itself)."""
        if not self.enabled or self._closed or len(data) > self.max_bytes:
            return None
        # Shielded: a client that goes away mid-parse must not free the regions for the next
        # body while the helper still reads this one (or leave its reply unread).
        return await asyncio.shield(self._parse_in_turn(data))

    async def _parse_in_turn(self, data: bytes | memoryview) -> HelperParse | None:
        async with self._lock:
            channel = None if self._closed else self._running()
            if channel is None:
                return None
            try:
                reply = await asyncio.wait_for(channel.ask(data), REPLY_TIMEOUT_S)
            except (OSError, EOFError, asyncio.TimeoutError) as exc:
                log.warning("the JSON helper process stopped answering (%r); restarting it", exc)
                self._stop(kill=True)
                return None
            if not reply:
                return None
            light = len(reply) <= LIGHT_REPLY_BYTES
            if light:
                message = _message(reply, channel.target)
            else:
                loop = asyncio.get_running_loop()
                message = await loop.run_in_executor(
                    self._executor, _message, reply, channel.target
                )
            return None if message is None else HelperParse(message, light)

    def _running(self) -> _Channel | None:
        """The helper, started if it is not running; None if it cannot be."""
        if self._channel is not None and self._channel.process.poll() is not None:
            log.warning("the JSON helper process exited (%s)", self._channel.process.returncode)
            self._stop()
        if self._channel is None:
            try:
                self._channel = _Channel(self.max_bytes)
            except OSError as exc:
                self._start_failures += 1
                self.enabled = self._start_failures < MAX_START_FAILURES
                log.warning(
                    "the JSON helper process could not start (%s)%s",
                    exc,
                    "" if self.enabled else "; large JSON bodies are parsed in the daemon",
                )
                return None
            self._start_failures = 0
        return self._channel

    def _stop(self, kill: bool = False) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            channel.close(kill)

    async def close(self) -> None:
        """Stop the helper once the body it may be parsing is done; none starts after this."""
        self._closed = True
        async with self._lock:
            self._stop()


def _message(reply: bytes, target: mmap.mmap) -> dict[str, Any] | None:
    """The message of a helper reply, each placed tensor's doubles copied out of ``target``
    (the next body overwrites it); None if it nests deeper than json reads here (the helper
    wrote it from a shallower stack): the caller's own parser then says so."""
    try:
        answer = json.loads(reply)
    except RecursionError:
        return None
    message: dict[str, Any] = answer["message"]
    for key, index, offset, count in answer["arrays"]:
        tensor = message[key][index]
        doubles = np.frombuffer(target, np.float64, count, offset)
        # FP32 (nearly every JSON tensor) converted here in the copy the decoder would make;
        # the rest copied as doubles, for the decoder to convert or refuse.
        tensor["data"] = (
            doubles.astype(np.float32) if tensor.get("datatype") == "FP32" else doubles.copy()
        )
    return message
