"""One activator over both serving planes, so the updater can install any package.

Tensor models are served by the ``ModelRegistry``, language models (``text-generation``,
``embedding``) by the ``LanguagePlane``. The updater knows neither: it activates a package
directory, unloads and looks up a model by name, and starts a canary. ``Planes`` sends each
call to the plane that serves the package's task, so a signed release of a language model is
hot-swapped by the language plane (the old version drains) exactly as a tensor release is by
the registry. A language model's release downloads the variant ``language_variants`` picks.

A language model takes no live canary (the canary judge measures tensor requests): the
updater checks a language release's golden chats before it takes traffic instead
(docs/fleet/canary.md), and ``canary`` refuses one that still arrives here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent._toml import tomllib
from edgeagent.engine.canary_judge import Canary, CanaryPolicy
from edgeagent.engine.errors import InvalidInput, LoadFailed
from edgeagent.engine.language.plane import LanguagePlane
from edgeagent.engine.registry import READY, Check, LoadedModel, ModelRegistry
from edgeagent.models.names import TEXT_TASKS
from edgeagent.models.package import ModelPackage
from edgeagent.models.text_golden import Replay, TextGolden
from edgeagent.runtimes import RuntimeUnavailable, installed_version
from edgeagent.runtimes.facts import GENERATIVE_RUNTIMES


def is_language_package(directory: Path) -> bool:
    """Whether ``directory`` holds a language model, by its task alone: reading the whole
    package (hashing its files) is its plane's job. An unreadable one is not (the tensor
    registry reports why it cannot load it)."""
    try:
        task = tomllib.loads((directory / "model.toml").read_text("utf-8")).get("task")
    except (OSError, ValueError):
        return False
    return task in TEXT_TASKS


def language_variants(available: Sequence[str]) -> list[str]:
    """The variant of a language model's release a device downloads: the first the release
    lists (its packager's order) whose generative runtime is installed here. Nothing can be
    probed before the files exist, and the language plane probes what it loads; empty for a
    tensor model's release (the hardware profile's ranking chooses those)."""
    for key in available:
        runtime = key.split("/", 1)[0]
        if runtime not in GENERATIVE_RUNTIMES:
            continue
        try:
            installed_version(runtime)
        except RuntimeUnavailable:
            continue
        return [key]
    return []


@dataclass
class ServedText:
    """A language model as the updater sees it: its package, which the health check replays
    (``updates.text_health``). It answers no tensor request."""

    package: ModelPackage
    # the golden chats on the copy placed to serve it (LanguagePlane.stage); None: the check
    # loads a copy of its own
    replay: Callable[[TextGolden], Awaitable[tuple[str, Replay] | None]] | None = None

    async def infer(
        self, feeds: dict[str, np.ndarray], *, priority: int = 0, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        raise InvalidInput(f"{self.package.name} is a language model: it takes no tensors")


class Planes:
    """The updater's activator: each package to the plane that serves its task."""

    def __init__(self, registry: ModelRegistry, language: LanguagePlane) -> None:
        self.registry = registry
        self.language = language

    async def activate(self, package_dir: Path) -> LoadedModel | ServedText:
        """Hot swap to the package (LoadFailed, or the plane's own error, when it cannot)."""
        if is_language_package(package_dir):
            info = await self.language.load(package_dir)
            return ServedText(self.language.package(info.name))
        return await self.registry.activate(package_dir)

    async def unload(self, name: str) -> None:
        if name in self.language.names():
            await self.language.unload(name)
        else:
            await self.registry.unload(name)

    def get(self, name: str) -> LoadedModel | ServedText:
        """The version serving ``name`` (the registry's errors when neither plane has it)."""
        if name in self.language.names():
            return ServedText(self.language.package(name))
        return self.registry.get(name)

    async def stage(self, package_dir: Path) -> ServedText:
        """A language release placed but not serving, for its health check to replay its
        golden chats on; ``activate`` of the same directory then serves that copy."""
        package = await self.language.stage(package_dir)
        return ServedText(package, partial(self.language.replay_staged, package.name))

    async def discard(self, name: str) -> None:
        """Drop a staged language release (its check failed)."""
        await self.language.discard_staged(name)

    def index(self) -> list[dict[str, str]]:
        """The registry's index and one row per served language model (what a new agent of a
        self-update must serve too)."""
        rows = self.registry.index()
        for info in self.language.models():
            rows.append({"name": info.name, "version": info.version, "state": READY, "reason": ""})
        return rows

    def status(self) -> dict[str, Any]:
        """The registry's status with each served language model in the same shape, so the
        fleet's state report (and ``hub status``) lists the versions of both planes."""
        models = dict(self.registry.status())
        for info in self.language.models():
            precision = info.quantization.lower()
            backend = {"runtime": info.runtime, "device": info.device, "precision": precision}
            models[info.name] = {
                "state": READY,
                "active_version": info.version,
                "versions": {info.version: backend},
            }
        return models

    def canary_policy(self, **overrides: Any) -> CanaryPolicy:
        return self.registry.canary_policy(**overrides)

    async def canary(
        self, package_dir: Path, policy: CanaryPolicy | None = None, *, check: Check | None = None
    ) -> Canary:
        if is_language_package(package_dir):
            raise LoadFailed(
                f"{package_dir.name}: a language model takes no live canary (its golden chats "
                "are checked before it takes traffic instead)"
            )
        return await self.registry.canary(package_dir, policy, check=check)


def split_text(directories: list[Path]) -> tuple[list[Path], list[Path]]:
    """(tensor packages, language-model packages): each goes to its own plane. A package that
    cannot be read stays with the tensor registry, which reports why."""
    tensors: list[Path] = []
    texts: list[Path] = []
    for directory in directories:
        (texts if is_language_package(directory) else tensors).append(directory)
    return tensors, texts
