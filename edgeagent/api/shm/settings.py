"""[shared_memory] keys: the v2 system shared-memory extension's protective limits."""

from __future__ import annotations

from dataclasses import dataclass

from edgeagent.sections import require, setting


@dataclass(frozen=True)
class SharedMemorySettings:
    """[shared_memory]: who may register regions, how many and how large each may be."""

    enabled: bool = setting(True, "serve the v2 system shared-memory extension")
    tcp: bool = setting(
        False,
        "serve it to TCP callers too (HTTP and gRPC); the agent cannot tell which local user "
        "is calling over TCP, so it then opens only objects every user may read and write",
    )
    max_regions: int = setting(64, "regions registered at once")
    max_region_bytes: int = setting(
        256 * 1024 * 1024, "span (offset + byte_size) of one region", "bytes"
    )

    def validate(self) -> None:
        require(self.max_regions > 0, "shared_memory", "max_regions", "must be positive")
        require(self.max_region_bytes > 0, "shared_memory", "max_region_bytes", "must be positive")
