"""[shared_memory] keys: the v2 system shared-memory extension's protective limits."""

from __future__ import annotations

from dataclasses import dataclass

from edgeagent.sections import require


@dataclass(frozen=True)
class SharedMemorySettings:
    """[shared_memory]: how many regions clients may register and how large each may be."""

    enabled: bool = True
    max_regions: int = 64
    max_region_bytes: int = 256 * 1024 * 1024  # the mapped span (offset + byte_size) of one region

    def validate(self) -> None:
        require(self.max_regions > 0, "shared_memory", "max_regions", "must be positive")
        require(self.max_region_bytes > 0, "shared_memory", "max_region_bytes", "must be positive")
