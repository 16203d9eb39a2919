"""What the installer drives of the serving side: the registry's hot swap in and back, unload,
a canary beside the serving version (``Activator``), and a served model's inference
(``Served``). Protocols, so ``updates`` names the engine's part it needs without taking the
whole registry; ``engine.planes.Planes`` and ``engine.registry.ModelRegistry`` fill them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from edgeagent.models.package import ModelPackage
from edgeagent.updates.canary_step import CanaryRegistry


class Served(Protocol):
    """What the registry's LoadedModel offers the health check."""

    package: ModelPackage

    async def infer(
        self, feeds: dict[str, np.ndarray], *, priority: int = 0, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]: ...


class Activator(CanaryRegistry, Protocol):
    """The part of ModelRegistry the updater drives (hot swap in, hot swap back, unload, and
    a canary beside the serving version)."""

    async def activate(self, package_dir: Path) -> Served: ...

    async def unload(self, name: str) -> None: ...

    def get(self, name: str) -> Served: ...
