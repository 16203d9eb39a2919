"""The JSON helper process: parses large infer bodies for the daemon, outside its GIL.

simdjson holds the GIL for the whole parse of a body (~4 ms for a 224×224×3 FP32 tensor), and
at v2 JSON c=16 the daemon's GIL is its serial bottleneck: the machine sat 20 % idle while the
event loop, the parse and the inference workers' hand-offs took turns at it. Here the parse runs
in a process of its own, and only a few hundred bytes cross back through the channel:

- the daemon writes the JSON part into the ``source`` region (shared memory) and sends its
  length (``HEAD``, 8 bytes) over the channel (a Unix socket pair);
- this process parses it (``edgeagent.api.jsonparse.simd``), copies each float tensor's doubles into
  the ``target`` region, and answers with ``HEAD`` + a JSON reply: ``{"message": …, "arrays":
  [[key, index, offset, count], …]}``, the message with those tensors' ``data`` left null and
  ``arrays`` saying where each one's doubles lie. A length of 0 means "not taken": the daemon
  parses that body itself, so every error message stays the daemon's.

It imports neither numpy nor the rest of the agent (~15 MB of RSS), and reads nothing else: a
body only ever reaches it from the daemon's own memory. It keeps the memory it frees for the
next body (``edgeagent.heap.keep_freed_blocks``), so it grows to a few times the largest body
it has parsed, and stays there.

    python -m edgeagent.api.jsonparse.helper_process CHANNEL_FD SOURCE_FD SOURCE_BYTES TARGET_FD \
        TARGET_BYTES
"""

from __future__ import annotations

import contextlib
import json
import mmap
import socket
import struct
import sys
from typing import Any

from edgeagent.api.jsonparse.simd import parse_message
from edgeagent.heap import keep_freed_blocks

HEAD = struct.Struct("<Q")
NOT_TAKEN = b""


class _TargetFull(Exception):
    """The doubles do not fit the target region: the daemon parses this body itself."""


class _Placed:
    """Where a tensor's doubles went, until the reply says so in its ``arrays``."""

    __slots__ = ("count", "offset")

    def __init__(self, offset: int, count: int) -> None:
        self.offset = offset
        self.count = count


def reply_for(source: mmap.mmap, length: int, target: mmap.mmap) -> bytes:
    """The reply to one body of ``length`` bytes at the start of ``source`` (NOT_TAKEN when the
    fast path does not take it, or its doubles do not fit ``target``)."""
    if length > len(source):
        return NOT_TAKEN
    used = 0

    def take(buffer: Any) -> _Placed:
        nonlocal used
        raw = memoryview(buffer).cast("B")
        end = used + len(raw)
        if end > len(target):
            raise _TargetFull
        target[used:end] = raw
        placed = _Placed(used, len(raw) // 8)
        used = end
        return placed

    try:
        message = parse_message(source[:length], take)
    except (ValueError, RuntimeError, _TargetFull):  # simdjson's errors, UnicodeDecodeError too
        return NOT_TAKEN
    if not isinstance(message, dict):
        return NOT_TAKEN
    arrays = []
    for key in ("inputs", "outputs"):
        entries = message.get(key)
        for index, entry in enumerate(entries if isinstance(entries, list) else []):
            if isinstance(entry, dict) and isinstance(placed := entry.get("data"), _Placed):
                entry["data"] = None
                arrays.append([key, index, placed.offset, placed.count])
    try:
        return json.dumps({"message": message, "arrays": arrays}, separators=(",", ":")).encode()
    except RecursionError:  # nested deeper than json.dumps goes: the daemon's parser says so
        return NOT_TAKEN


def _read_exactly(channel: socket.socket, size: int) -> bytes | None:
    """``size`` bytes from the channel; None once the daemon has closed its end."""
    data = channel.recv(size, socket.MSG_WAITALL)
    return data if len(data) == size else None


def serve(channel: socket.socket, source: mmap.mmap, target: mmap.mmap) -> None:
    """Answer bodies one at a time until the daemon closes the channel."""
    while (head := _read_exactly(channel, HEAD.size)) is not None:
        (length,) = HEAD.unpack(head)
        reply = reply_for(source, length, target)
        channel.sendall(HEAD.pack(len(reply)) + reply)


def main(argv: list[str]) -> int:
    channel_fd, source_fd, source_bytes, target_fd, target_bytes = (int(a) for a in argv)
    keep_freed_blocks()
    channel = socket.socket(fileno=channel_fd)
    with (
        mmap.mmap(source_fd, source_bytes) as source,
        mmap.mmap(target_fd, target_bytes) as target,
        contextlib.suppress(ConnectionError, KeyboardInterrupt),  # the daemon went away
    ):
        serve(channel, source, target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
