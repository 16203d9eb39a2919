"""Unpack a release artifact (``.tar.gz``) without trusting a single byte of its structure.

The hash was already checked, so a hostile archive would need a compromised signing key; still,
the unpacker is the last line before files land on the device, so it refuses everything a model
package never contains: absolute paths, ``..``, links of any kind (a link, even one pointing
inside, lets a later entry write through it), device nodes and FIFOs, duplicate entries, more
entries or more bytes than configured. Every entry counts toward the entry limit — directories
and ``./`` too, so an artifact of a few hundred KB cannot create 60,000 directories — and a pax
or GNU long-name header is refused above ``max_header_bytes`` before it is read into memory.
Sizes are enforced on the bytes actually written, not on the header's claims, so a lying header
cannot fill the disk. Owners and modes from the archive
are ignored: files become 0644 and directories 0755.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path, PurePosixPath

_CHUNK = 1 << 20
DEFAULT_MAX_HEADER_BYTES = 64 * 1024  # a pax header holding a long path is a few hundred bytes


class UnpackError(ValueError):
    """The artifact is not a safe model package archive; the message names the entry."""


def _safe_parts(name: str) -> tuple[str, ...]:
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")):
        raise UnpackError(f"entry {name!r} has an absolute path")
    parts = tuple(p for p in path.parts if p not in ("", "."))
    if any(p == ".." for p in parts):
        raise UnpackError(f"entry {name!r} climbs out of the package with '..'")
    if any("\\" in p or "\x00" in p for p in parts):
        raise UnpackError(f"entry {name!r} contains a backslash or NUL")
    return parts


def _check_kind(member: tarfile.TarInfo) -> None:
    if member.issym() or member.islnk():
        raise UnpackError(
            f"entry {member.name!r} is a link to {member.linkname!r}; links are not allowed"
        )
    if not (member.isfile() or member.isdir()):
        raise UnpackError(f"entry {member.name!r} is a device, FIFO or other special file")


def _bounded_tarinfo(max_header_bytes: int) -> type[tarfile.TarInfo]:
    """A TarInfo whose extended headers (pax, GNU long names) are refused above the limit.

    tarfile reads such a header's whole claimed size into memory before parsing it; checking
    the claim first keeps a 500 MB "header" from ever being read.
    """

    class BoundedTarInfo(tarfile.TarInfo):
        def _check_header_size(self) -> None:
            if self.size > max_header_bytes:
                raise UnpackError(
                    f"an extended tar header of {self.size} bytes is over the limit of "
                    f"{max_header_bytes} bytes"
                )

        def _proc_pax(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
            self._check_header_size()
            return super()._proc_pax(archive)  # type: ignore[misc]  # private, stable since 3.2

        def _proc_gnulong(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
            self._check_header_size()
            return super()._proc_gnulong(archive)  # type: ignore[misc]

    return BoundedTarInfo


def _copy_capped(source, target: Path, budget: int, name: str) -> int:
    """Copy at most ``budget`` bytes; raise when the entry holds more. Returns bytes written."""
    written = 0
    with target.open("xb") as out:
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if written > budget:
                raise UnpackError(f"entry {name!r} exceeds the unpacked size limit")
            out.write(chunk)
    target.chmod(0o644)
    return written


def unpack_files(
    archive: Path,
    dest: Path,
    *,
    max_bytes: int,
    max_files: int,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
) -> None:
    """Extract ``archive`` into the new directory ``dest`` with every check below (a variant's
    archive of release format 2 holds only its files). On any error ``dest`` is removed again.

    ``max_files`` bounds the archive's entries of every kind.
    """
    dest.mkdir(parents=True)
    try:
        _extract(
            archive,
            dest,
            max_bytes=max_bytes,
            max_files=max_files,
            max_header_bytes=max_header_bytes,
        )
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def unpack_archive(
    archive: Path,
    dest: Path,
    *,
    max_bytes: int,
    max_files: int,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
) -> Path:
    """Extract ``archive`` (see ``unpack_files``) and return the package root in ``dest``.

    The package root is ``dest`` itself when ``model.toml`` is at the top of the archive, or
    the single top-level directory holding it. On any error ``dest`` is removed again.
    """
    unpack_files(
        archive, dest, max_bytes=max_bytes, max_files=max_files, max_header_bytes=max_header_bytes
    )
    try:
        return _package_root(dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _open_tar(archive: Path, tarinfo: type[tarfile.TarInfo]) -> tarfile.TarFile:
    """Artifacts are ``.tar.gz``; a delta's result is the uncompressed ``.tar`` it was checked
    as (``updates.deltas``). No other compression is accepted."""
    if archive.suffix == ".tar":
        return tarfile.open(archive, mode="r:", tarinfo=tarinfo)
    return tarfile.open(archive, mode="r:gz", tarinfo=tarinfo)


def _extract(
    archive: Path, dest: Path, *, max_bytes: int, max_files: int, max_header_bytes: int
) -> None:
    seen: set[tuple[str, ...]] = set()
    total = 0
    entries = 0
    try:
        with _open_tar(archive, _bounded_tarinfo(max_header_bytes)) as tar:
            for member in tar:
                entries += 1
                if entries > max_files:
                    raise UnpackError(f"more than {max_files} entries (the file-count limit)")
                parts = _safe_parts(member.name)
                _check_kind(member)
                if not parts:
                    continue  # the archive's "./" entry
                if parts in seen:
                    raise UnpackError(f"entry {member.name!r} appears twice")
                seen.add(parts)
                target = dest.joinpath(*parts)
                if member.isdir():
                    target.mkdir(mode=0o755, parents=True, exist_ok=True)
                    continue
                if total + member.size > max_bytes:
                    raise UnpackError(f"entry {member.name!r} exceeds the unpacked size limit")
                target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:  # pragma: no cover - regular files always have data
                    raise UnpackError(f"entry {member.name!r} has no data")
                total += _copy_capped(source, target, max_bytes - total, member.name)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UnpackError(f"{archive.name}: not a readable .tar.gz ({exc})") from exc


def _package_root(dest: Path) -> Path:
    if (dest / "model.toml").is_file():
        return dest
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / "model.toml").is_file():
        return entries[0]
    raise UnpackError("the archive holds no model.toml at its top or in one top-level directory")
