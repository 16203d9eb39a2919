"""Find a model package from what a user typed: a directory, or a name in the models directory."""

from __future__ import annotations

from pathlib import Path

from edgeagent.models.package import PackageError
from edgeagent.paths import default_models_dir


def resolve_package(model: str, models_dir: Path | None = None) -> Path:
    """A path to a package directory, or the name of one under ``models_dir``."""
    candidate = Path(model)
    if candidate.is_dir():
        return candidate
    directory = models_dir or default_models_dir()
    named = directory / model
    if named.is_dir():
        return named
    available = sorted(p.name for p in directory.glob("*") if (p / "model.toml").is_file())
    hint = f"; available: {', '.join(available)}" if available else f"; {directory} has none"
    raise PackageError(f"no model package {model!r} (not a directory, not in {directory}){hint}")
