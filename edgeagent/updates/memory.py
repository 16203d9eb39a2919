"""Can this device hold a second version of a model? The check before a canary loads.

A canary keeps the old version loaded beside the new one. The old one is already counted
against ``MemAvailable`` (the kernel's estimate of what can be allocated without swapping,
``/proc/meminfo``), so the question is only whether the new one fits: its largest variant
artifact × ``[updates] canary_memory_factor`` (a runtime holds the weights plus arenas and the
optimised graph; the signed artifact size is known before anything is downloaded, and model
weights barely compress), with ``[updates] canary_min_free_bytes`` left over. No psutil: every
Linux the agent runs on has /proc/meminfo; where it is missing the check is skipped and says so.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """``MemAvailable`` in bytes, or None where the kernel does not report it."""
    try:
        lines = meminfo.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            fields = rest.split()
            if fields and fields[0].isdigit():
                return int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return None


def memory_shortfall(
    variant_bytes: int, *, factor: float, min_free_bytes: int, meminfo: Path = MEMINFO
) -> str | None:
    """Why the device cannot load a variant of ``variant_bytes`` beside what serves now, or
    None when it can."""
    available = available_bytes(meminfo)
    if available is None:
        log.warning("no MemAvailable in %s: the canary's memory check is skipped", meminfo)
        return None
    needed = int(variant_bytes * factor)
    if available - needed >= min_free_bytes:
        return None
    return (
        f"a canary beside the serving version needs about {needed / 2**20:.1f} MiB "
        f"({factor:g} × its {variant_bytes / 2**20:.1f} MiB variant, [updates] "
        f"canary_memory_factor) and must leave {min_free_bytes / 2**20:.1f} MiB free "
        f"([updates] canary_min_free_bytes); {available / 2**20:.1f} MiB is available"
    )
