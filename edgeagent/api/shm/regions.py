"""System shared-memory regions (the v2 extension): a local app passes tensors with no body copy.

A client creates a POSIX shared-memory object (``shm_open``; it appears under ``/dev/shm``),
registers it here by name, key, offset and byte size, and then names the region in its infer
requests instead of sending the bytes. An input is read out of the object, an output written
into it; neither travels through the HTTP or gRPC body.

What protects the agent:

- a key is one plain name (no directory parts) opened under /dev/shm with ``O_NOFOLLOW`` and
  must be a regular file, so a client can name nothing but shared memory;
- the agent never maps a client's object. A live mapping of a file its owner truncates faults
  (SIGBUS) on the next access and kills the daemon; a size check before the access does not
  help, since the owner can truncate between the check and the access. Every access is an
  ``os.preadv``/``os.pwrite`` on the object's descriptor instead, which past the end of a
  shrunk object reads short (refused with a 400) and never faults. It costs one copy of an
  input (the runtime copied a mapped one into its batch anyway);
- a region belongs to the caller that registered it (``Caller.owner``: a Unix-socket peer's
  uid, a TCP caller's token): only that caller lists it, uses it and unregisters it, and
  region names are per caller, so one client cannot even learn another's names;
- the agent opens an object for a caller only when that caller could open it itself (owner,
  group and mode checked against the caller's uid and groups). Over TCP the caller's uid is
  unknown, so the extension is served on TCP only with ``[shared_memory] tcp = true``, and
  then only for objects every local user may read and write;
- the number and size of regions are limited by ``[shared_memory]``; a region's descriptor is
  closed when its client unregisters it or the agent stops (under the region's lock, so a
  request reading it on another thread never reads a descriptor number reused by then).
"""

from __future__ import annotations

import functools
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.api.shm.settings import SharedMemorySettings
from edgeagent.engine.errors import InvalidInput, ModelNotFound, QueueFull, ServingError

SHM_ROOT = Path("/dev/shm")
_KEY = re.compile(r"/?([A-Za-z0-9_.-]{1,255})")
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_READ_WRITE = 0o6  # the r and w bits of one permission class


class RegionNotFound(ModelNotFound):
    """No region of that name is registered by this caller (404, like an unknown model)."""


class RegionForbidden(ServingError):
    """The caller may not use shared memory this way (403): the object is not its to open, or
    the extension is not served on its transport."""

    status = 403


@dataclass(frozen=True)
class Caller:
    """Who is asking, as far as the transport can tell.

    ``owner`` binds regions: two requests with the same owner see the same regions. ``uid`` and
    ``gids`` are the caller's credentials when the transport knows them (a Unix-socket peer);
    ``uid`` None means any local user may be behind the request. ``network`` marks TCP callers.
    """

    owner: str
    uid: int | None
    gids: frozenset[int] = frozenset()
    network: bool = False

    def may_open(self, info: os.stat_result) -> bool:
        """Whether the caller could open an object with this owner and mode read-write itself
        (the kernel's rule: the owner's bits, else the group's, else everyone's)."""
        mode = info.st_mode
        if self.uid is None:  # whoever it is: owner, group members and others all need rw
            return mode & 0o666 == 0o666
        if self.uid == 0:
            return True
        if info.st_uid == self.uid:
            bits = mode >> 6
        elif info.st_gid in self.gids:
            bits = mode >> 3
        else:
            bits = mode
        return bits & _READ_WRITE == _READ_WRITE


def agent_user() -> Caller:
    """The agent's own user: every peer of a socket that only this user (and root) may use."""
    uid = os.geteuid()
    return Caller(f"uid {uid}", uid, frozenset({os.getegid(), *os.getgroups()}))


class Region:
    """One registered region: the client's view (key, offset, size) and the object's descriptor.

    Every access re-checks the object's size and reads or writes through the descriptor under
    the region's lock (see the module docstring for why nothing is mapped).
    """

    def __init__(self, name: str, key: str, offset: int, byte_size: int, fd: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._fd = fd
        self._lock = threading.Lock()  # readers run on the JSON thread, release on the loop

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    @contextmanager
    def _access(self, offset: int, byte_size: int, where: str) -> Iterator[tuple[int, int]]:
        """(descriptor, absolute position) for ``byte_size`` bytes at ``offset``, held locked."""
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise InvalidInput(
                f"{where}: offset {offset} + byte size {byte_size} runs past the end of shared "
                f"memory region {self.name!r} ({self.byte_size} bytes)"
            )
        with self._lock:
            if self._fd < 0:
                raise RegionNotFound(f"shared memory region {self.name!r} was unregistered")
            start = self.offset + offset
            self._check_size(start + byte_size, where)
            yield self._fd, start

    def _check_size(self, needed: int, where: str, size: int | None = None) -> None:
        """Refuse an access to an object that shrank below ``needed`` bytes since registration."""
        size = os.fstat(self._fd).st_size if size is None else size
        if size < needed:
            raise InvalidInput(
                f"{where}: shared memory key {self.key!r} shrank to {size} bytes, but region "
                f"{self.name!r} needs {needed}; register it again"
            )

    def read(self, offset: int, byte_size: int, where: str) -> memoryview:
        """A private, writable copy of ``byte_size`` bytes at ``offset`` within the region."""
        buffer = bytearray(byte_size)
        with self._access(offset, byte_size, where) as (fd, start):
            got = os.preadv(fd, [buffer], start) if byte_size else 0
            if got < byte_size:  # truncated between the size check and the read
                self._check_size(start + byte_size, where, start + got)
        return memoryview(buffer)

    def write(self, offset: int, data: memoryview, where: str) -> None:
        """Write ``data`` (bytes) at ``offset`` within the region."""
        with self._access(offset, data.nbytes, where) as (fd, start):
            done = 0
            while done < data.nbytes:  # tmpfs writes whole buffers; a short write continues
                done += os.pwrite(fd, data[done:], start + done)

    def release(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _shm_path(key: str) -> Path:
    match = _KEY.fullmatch(key)
    if match is None or match.group(1) in (".", ".."):
        raise InvalidInput(
            f"shared memory key {key!r} is not a POSIX shared memory name: one name of letters, "
            f"digits, '.', '_' or '-', optionally after a leading '/'"
        )
    return SHM_ROOT / match.group(1)


def _open(path: Path, key: str, span: int, caller: Caller) -> int:
    """A read-write descriptor of the shared memory object at ``path`` (at least ``span``
    bytes), refused unless ``caller`` could have opened it itself."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidInput(f"cannot open shared memory key {key!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)  # the object opened, not whatever the path names by now
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"shared memory key {key!r} is not a shared memory object")
        if not caller.may_open(info):
            who = "any local user" if caller.uid is None else f"uid {caller.uid}"
            raise RegionForbidden(
                f"shared memory key {key!r} (owner uid {info.st_uid}, group {info.st_gid}, mode "
                f"{stat.S_IMODE(info.st_mode):04o}) cannot be opened read-write by {who}, who "
                f"asks for it; the agent opens only objects its caller could open itself"
            )
        if info.st_size < span:
            raise InvalidInput(
                f"shared memory key {key!r} has {info.st_size} bytes; offset + byte_size "
                f"needs {span}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


class SharedMemoryRegistry:
    """The registered regions of every transport, each bound to the caller that registered it
    (HTTP and gRPC callers with the same owner see the same regions)."""

    def __init__(self, settings: SharedMemorySettings) -> None:
        self.settings = settings
        self._regions: dict[tuple[str, str], Region] = {}

    def admit(self, caller: Caller) -> None:
        """Refuse a caller the extension is not served to (disabled, or TCP without ``tcp``)."""
        if not self.settings.enabled:
            raise InvalidInput("the shared memory extension is disabled ([shared_memory] enabled)")
        if caller.network and not self.settings.tcp:
            raise RegionForbidden(
                "shared memory is served on the agent's Unix socket only ([shared_memory] tcp "
                "= false): over TCP the agent cannot tell which local user is calling"
            )

    def register(self, caller: Caller, name: str, key: str, offset: int, byte_size: int) -> None:
        self.admit(caller)
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise InvalidInput(
                f"region name {name!r}: use 1-128 letters, digits, '.', '_', ':', '-'"
            )
        for label, value in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInput(f"region {name!r}: {label} must be a non-negative integer")
        if not isinstance(key, str):
            raise InvalidInput(f"region {name!r}: key must be a string")
        if (caller.owner, name) in self._regions:
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
        fd = _open(_shm_path(key), key, span, caller)
        self._regions[caller.owner, name] = Region(name, key, offset, byte_size, fd)

    def unregister(self, caller: Caller, name: str | None = None) -> None:
        """Release one of the caller's regions, or all of them when ``name`` is None or empty
        (Triton's "unregister all", which here reaches only the caller's own)."""
        self.admit(caller)
        if not name:
            for key in [key for key in self._regions if key[0] == caller.owner]:
                self._regions.pop(key).release()
            return
        self.get(caller, name)
        self._regions.pop((caller.owner, name)).release()

    def status(self, caller: Caller, name: str | None = None) -> list[dict[str, Any]]:
        self.admit(caller)
        if name:
            return [self.get(caller, name).status()]
        return [
            region.status()
            for (owner, _), region in sorted(self._regions.items())
            if owner == caller.owner
        ]

    def get(self, caller: Caller, name: str) -> Region:
        try:
            return self._regions[caller.owner, name]
        except KeyError:
            raise RegionNotFound(f"no shared memory region {name!r} is registered") from None

    def of(self, identify: Callable[[], Caller]) -> CallerRegions:
        """The regions an infer request's caller may name (what the codecs read and write);
        ``identify`` finds the caller, and is called only when the request names a region."""
        return CallerRegions(self, identify)

    def close(self) -> None:
        """Release every region (the agent stops)."""
        regions, self._regions = self._regions, {}
        for region in regions.values():
            region.release()


class CallerRegions:
    """One caller's regions, as an infer request's tensors name them.

    Most requests name no region, so the caller (a socket peer's credentials: two
    ``getsockopt`` calls) is found at the first region a request names, once.
    """

    def __init__(self, registry: SharedMemoryRegistry, identify: Callable[[], Caller]) -> None:
        self.registry = registry
        self._identify = identify

    @functools.cached_property
    def caller(self) -> Caller:
        return self._identify()

    def _region(self, name: str) -> Region:
        self.registry.admit(self.caller)
        return self.registry.get(self.caller, name)

    def read(self, name: str, offset: int, byte_size: int, where: str) -> memoryview:
        """A copy of the bytes an input names (``InvalidInput``/404 when they are not there)."""
        return self._region(name).read(offset, byte_size, where)

    def write(self, name: str, offset: int, data: memoryview, where: str) -> None:
        """Write an output's bytes where it names (``InvalidInput``/404 as for ``read``)."""
        self._region(name).write(offset, data, where)


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
