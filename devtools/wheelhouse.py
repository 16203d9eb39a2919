"""A device's wheelhouse without a package index: the agent's dependencies as real wheels.

On a board ``pip wheel . -w wh/`` fetches the agent's dependencies from PyPI. The tests run
offline, so each installed distribution the agent needs is packed back into the wheel it was
installed from: the files its ``RECORD`` lists inside site-packages (not the scripts pip
generated, not byte-code), its ``.dist-info`` with a fresh ``RECORD`` (sha256 and size of every
member, as the wheel format wants) and its ``WHEEL`` tags in the file name. pip installs such a
wheel into a new venv exactly as it installs the one from PyPI: the venv holds its own copy of
every file and reads nothing of the test environment.
"""

from __future__ import annotations

import base64
import csv
import email
import hashlib
import importlib.metadata as metadata
import io
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

_LEFT_OUT = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}  # written by the installer


def dependencies(requirements: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions that ``requirements`` (``Requires-Dist`` lines, extras
    left out) need, recursively."""
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(requirement.name)
        if key in found:
            continue
        found[key] = metadata.distribution(requirement.name)
        todo += [Requirement(r) for r in found[key].requires or []]
    return [found[key] for key in sorted(found)]


def _tags(wheel_file: str) -> str:
    """The compressed tag set of a ``WHEEL`` file (``cp311-cp311-manylinux_…_x86_64``)."""
    parts: list[list[str]] = [[], [], []]
    for line in wheel_file.splitlines():
        if line.startswith("Tag:"):
            for seen, part in zip(parts, line.split(":", 1)[1].strip().split("-"), strict=True):
                if part not in seen:
                    seen.append(part)
    if not parts[0]:
        raise ValueError("the WHEEL file names no tag")
    return "-".join(".".join(part) for part in parts)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(distribution: metadata.Distribution, into: Path) -> Path:
    """The installed ``distribution`` as a wheel in ``into``; return its path."""
    files = [f for f in distribution.files or [] if ".." not in f.parts and f.suffix != ".pyc"]
    info = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    wheel_file = distribution.read_text("WHEEL") or ""
    stem = info.removesuffix(".dist-info")
    path = into / f"{stem}-{_tags(wheel_file)}.whl"
    rows: list[tuple[str, str, str]] = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as wheel:
        for name in files:
            if name.parts[0] == info and name.name in _LEFT_OUT:
                continue
            data = Path(str(distribution.locate_file(name))).read_bytes()
            wheel.writestr(name.as_posix(), data)
            rows.append((name.as_posix(), _digest(data), str(len(data))))
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows([*rows, (f"{info}/RECORD", "", "")])
        wheel.writestr(f"{info}/RECORD", record.getvalue())
    return path


def requirements_of(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of ``wheel``'s metadata."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    return email.message_from_string(text).get_all("Requires-Dist") or []


def dependency_wheels(wheel: Path, into: Path) -> list[Path]:
    """Every dependency ``wheel`` declares, recursively, as a wheel in ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    return [repack(found, into) for found in dependencies(requirements_of(wheel))]
