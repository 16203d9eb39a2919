"""The C heap of a long-running agent: fewer malloc arenas, and free pages handed back.

glibc gives every thread that allocates an arena of its own (up to 8 per core), and a freed
block returns to the system only from the top of an arena. The agent's worker threads, the
runtimes' thread pools and a model load (the probe session, then the serving one) leave
megabytes of free but resident pages behind: 10 MB of a 117 MB daemon with one MobileNetV2.
On a C library without these calls (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt's M_ARENA_MAX (malloc.h); two arenas keep the loop and one worker thread apart.
M_ARENA_MAX = -8
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def limit_arenas(count: int = ARENAS) -> bool:
    """Cap malloc's arenas before threads start; True where the C library supports it."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    return bool(mallopt is not None and mallopt(M_ARENA_MAX, count))


def release_free_memory() -> bool:
    """Return free heap pages to the system (after a model load); True where supported."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
