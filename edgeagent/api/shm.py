"""System shared-memory regions (the v2 extension): a local app passes tensors with no body copy.

A client creates a POSIX shared-memory object (``shm_open``; it appears under ``/dev/shm``),
registers it here by name, key, offset and byte size, and then names the region in its infer
requests instead of sending the bytes. An input is read straight out of the mapping (numpy views
it; nothing is copied on the way to the runtime), an output is written into it.

What protects the agent: a key is one plain name (no directory parts) opened under /dev/shm
with ``O_NOFOLLOW`` and must be a regular file the agent's user may open, so a client can map
nothing but shared memory; every region and every access is checked against the object's real
size; the number and size of regions are limited by ``[shared_memory]``; a region is unmapped
when the client unregisters it or the agent stops (a request still reading it keeps the mapping
alive until it finishes, never longer).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.api.shm_settings import SharedMemorySettings
from edgeagent.engine.errors import InvalidInput, ModelNotFound, QueueFull

SHM_ROOT = Path("/dev/shm")
_KEY = re.compile(r"/?([A-Za-z0-9_.-]{1,255})")
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class RegionNotFound(ModelNotFound):
    """No region of that name is registered (404, like an unknown model)."""


@dataclass
class Region:
    """One registered region: the client's view (key, offset, size) and the agent's mapping."""

    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def view(self, offset: int, byte_size: int, where: str) -> memoryview:
        """``byte_size`` bytes at ``offset`` within the region, refused when they run past it."""
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise InvalidInput(
                f"{where}: offset {offset} + byte size {byte_size} runs past the end of shared "
                f"memory region {self.name!r} ({self.byte_size} bytes)"
            )
        start = self.offset + offset
        return memoryview(self.mapping)[start : start + byte_size]

    def release(self) -> None:
        # A request in flight may still view it: then it is unmapped when its arrays are freed.
        with contextlib.suppress(BufferError):
            self.mapping.close()


def _shm_path(key: str) -> Path:
    match = _KEY.fullmatch(key)
    if match is None or match.group(1) in (".", ".."):
        raise InvalidInput(
            f"shared memory key {key!r} is not a POSIX shared memory name: one name of letters, "
            f"digits, '.', '_' or '-', optionally after a leading '/'"
        )
    return SHM_ROOT / match.group(1)


def _map(path: Path, key: str, span: int) -> mmap.mmap:
    """Map the first ``span`` bytes of the shared memory object at ``path`` read-write."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidInput(f"cannot open shared memory key {key!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"shared memory key {key!r} is not a shared memory object")
        if info.st_size < span:
            raise InvalidInput(
                f"shared memory key {key!r} has {info.st_size} bytes; offset + byte_size "
                f"needs {span}"
            )
        return mmap.mmap(fd, span, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


class SharedMemoryRegistry:
    """The registered regions, shared by every transport (HTTP and gRPC see the same ones)."""

    def __init__(self, settings: SharedMemorySettings) -> None:
        self.settings = settings
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not self.settings.enabled:
            raise InvalidInput("the shared memory extension is disabled ([shared_memory] enabled)")
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise InvalidInput(
                f"region name {name!r}: use 1-128 letters, digits, '.', '_', ':', '-'"
            )
        for label, value in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInput(f"region {name!r}: {label} must be a non-negative integer")
        if not isinstance(key, str):
            raise InvalidInput(f"region {name!r}: key must be a string")
        if name in self._regions:
            raise InvalidInput(f"shared memory region {name!r} is already registered")
        if len(self._regions) >= self.settings.max_regions:
            raise QueueFull(
                f"{len(self._regions)} shared memory regions are registered, the limit "
                f"([shared_memory] max_regions); unregister one first",
                retry_after=None,
            )
        span = offset + byte_size
        if byte_size == 0 or span > self.settings.max_region_bytes:
            raise InvalidInput(
                f"region {name!r}: offset + byte_size must be 1..{self.settings.max_region_bytes} "
                f"bytes ([shared_memory] max_region_bytes), got {span}"
            )
        mapping = _map(_shm_path(key), key, span)
        self._regions[name] = Region(name, key, offset, byte_size, mapping)

    def unregister(self, name: str | None = None) -> None:
        """Release one region, or every region when ``name`` is None or empty (as Triton does)."""
        if not name:
            self.close()
            return
        region = self._regions.pop(name, None)
        if region is None:
            raise RegionNotFound(f"no shared memory region {name!r} is registered")
        region.release()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        if name:
            return [self.get(name).status()]
        return [region.status() for _, region in sorted(self._regions.items())]

    def get(self, name: str) -> Region:
        try:
            return self._regions[name]
        except KeyError:
            raise RegionNotFound(f"no shared memory region {name!r} is registered") from None

    def view(self, name: str, offset: int, byte_size: int, where: str) -> memoryview:
        """The bytes an input or output names (``InvalidInput``/404 when they are not there)."""
        return self.get(name).view(offset, byte_size, where)

    def close(self) -> None:
        """Release every region (the agent stops)."""
        regions, self._regions = self._regions, {}
        for region in regions.values():
            region.release()


@dataclass(frozen=True)
class SharedMemoryRef:
    """Where a tensor's bytes are: a tensor's ``shared_memory_*`` parameters."""

    region: str
    offset: int
    byte_size: int

    def parameters(self) -> dict[str, Any]:
        return {
            "shared_memory_region": self.region,
            "shared_memory_offset": self.offset,
            "shared_memory_byte_size": self.byte_size,
        }


def shm_ref(parameters: dict[str, Any], where: str) -> SharedMemoryRef | None:
    """The region a tensor names in its parameters, or None when it names none."""
    region = parameters.get("shared_memory_region")
    if region is None:
        return None
    offset = parameters.get("shared_memory_offset", 0)
    size = parameters.get("shared_memory_byte_size")
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{where}: shared_memory_region must be a region name")
    for label, value in (("shared_memory_offset", offset), ("shared_memory_byte_size", size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"{where}: {label} must be a non-negative integer")
    return SharedMemoryRef(region, offset, size)  # type: ignore[arg-type]
