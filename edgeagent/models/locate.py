"""Find model packages: one from what a user typed, or every one in a models directory."""

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


def find_packages(directory: Path) -> dict[str, Path]:
    """The package directories in ``directory`` by directory name, sorted.

    A package is a subdirectory with a ``model.toml``. A subdirectory that cannot be looked
    into (``chmod 000``, an I/O error) is listed too: it may well be a package, and reading it
    (``load_package``) then fails with the reason, so one bad package is reported as such
    instead of stopping whoever lists them. Raises PackageError when ``directory`` itself does
    not exist, is not a directory or cannot be read.

    A directory that is itself a package is that one package: KServe's storage initializer
    puts one model's files straight into ``/mnt/models``, which the container serves as its
    models directory.
    """
    try:
        if (directory / "model.toml").is_file():
            return {directory.name: directory}
        entries = sorted(directory.iterdir())
    except FileNotFoundError as exc:
        raise PackageError(f"models directory {directory} does not exist") from exc
    except NotADirectoryError as exc:
        raise PackageError(f"models directory {directory} is not a directory") from exc
    except OSError as exc:
        raise PackageError(f"cannot read models directory {directory}: {exc.strerror}") from exc
    found = {}
    for path in entries:
        try:
            if not (path / "model.toml").is_file():
                continue
        except OSError:
            pass  # unreadable: listed, and its load says why
        found[path.name] = path
    return found
