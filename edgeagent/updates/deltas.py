"""Delta downloads: patch a held base into the new artifact, or fall back to the full one.

A signed artifact may name a delta from a base tar (``fleet.artifact.Delta``). This device
keeps, per model, the uncompressed tars of the release it committed last
(``bases/<model>/<version>/<tar sha256>.tar``: one more copy of the model on disk, the price
of small updates; ``[updates] keep_delta_bases`` turns it off). A delta is used only when:

1. a base with the named SHA-256 is held, and its bytes still hash to it (a file corrupted
   on disk is deleted, not trusted);
2. the patch downloads within its signed size and hash (``ArtifactDownload`` as for any
   artifact);
3. applying it yields exactly ``tar_size`` bytes (a longer output stops at once) whose
   SHA-256 is ``tar_sha256`` — checked *before* the tar is unpacked or kept as a base.

Any other outcome — no base, a wrong base, a truncated or corrupted patch, a result of the
right size but the wrong hash — is logged and the full artifact is downloaded instead, so a
delta can make an update smaller but never make it fail.

zstd's ``--patch-from`` (the base as a raw-content dictionary, long-distance matching) was
chosen over bsdiff4 and detools by ``scripts/bench_update.py --deltas``: patches within 1.5 %
of the smallest, applied 6-37× faster (docs/fleet/deltas.md).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import logging
import os
import shutil
import zlib
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import zstandard

from edgeagent.fleet.artifact import Artifact, Delta
from edgeagent.updates.download import file_sha256

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_MAX_WINDOW = 1 << 31  # zstd's largest window on 64-bit hosts


class DeltaError(RuntimeError):
    """The delta cannot produce the signed tar: the full artifact is taken instead."""


def window_bytes(base_bytes: int) -> int:
    """The zstd window a patch from a base of ``base_bytes`` may declare: base plus target of
    the same order, as a power of two (what ``hub sign`` compresses with)."""
    return min(_MAX_WINDOW, 1 << max(20, (2 * base_bytes).bit_length()))


def gunzip_to(archive: Path, out: Path, max_bytes: int) -> str:
    """Decompress a ``.tar.gz`` to ``out`` (at most ``max_bytes``); return the tar's SHA-256."""
    digest = hashlib.sha256()
    written = 0
    try:
        with gzip.open(archive, "rb") as source, out.open("wb") as target:
            while chunk := source.read(_CHUNK):
                written += len(chunk)
                if written > max_bytes:
                    raise DeltaError(f"{archive.name}: its tar is over {max_bytes} bytes")
                target.write(chunk)
                digest.update(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        out.unlink(missing_ok=True)
        raise DeltaError(f"{archive.name}: not a gzip stream ({exc})") from exc
    except DeltaError:
        out.unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def apply_delta(base: Path, patch: Path, out: Path, delta: Delta, max_base_bytes: int) -> None:
    """Write the tar ``delta`` promises to ``out``; ``DeltaError`` (and no ``out``) unless it
    is exactly ``tar_size`` bytes with SHA-256 ``tar_sha256``."""
    if base.stat().st_size > max_base_bytes:
        raise DeltaError(
            f"base {base.name} is over {max_base_bytes} bytes ([updates] max_delta_base_bytes)"
        )
    dictionary = zstandard.ZstdCompressionDict(
        base.read_bytes(), dict_type=zstandard.DICT_TYPE_RAWCONTENT
    )
    decompressor = zstandard.ZstdDecompressor(
        dict_data=dictionary, max_window_size=window_bytes(max_base_bytes)
    )
    digest = hashlib.sha256()
    written = 0
    try:
        with patch.open("rb") as source, out.open("wb") as target:
            reader = decompressor.stream_reader(source, read_across_frames=False)
            while chunk := reader.read(_CHUNK):
                written += len(chunk)
                if written > delta.tar_size:
                    raise DeltaError(f"the patch gives more than the signed {delta.tar_size} bytes")
                target.write(chunk)
                digest.update(chunk)
        if written != delta.tar_size:
            raise DeltaError(f"the patch gives {written} bytes, not the signed {delta.tar_size}")
        if digest.hexdigest() != delta.tar_sha256:
            raise DeltaError(
                f"the patched tar's SHA-256 {digest.hexdigest()} is not the signed "
                f"{delta.tar_sha256}"
            )
    except zstandard.ZstdError as exc:
        out.unlink(missing_ok=True)
        raise DeltaError(f"the patch does not decompress: {exc}") from exc
    except BaseException:
        out.unlink(missing_ok=True)
        raise


class DeltaBases:
    """The tars kept for deltas: ``<root>/<model>/<version>/<sha256>.tar``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def held(self, sha256: str) -> Path | None:
        """A kept tar whose bytes hash to ``sha256``; a kept file that does not is deleted."""
        for path in sorted(self.root.glob(f"*/*/{sha256}.tar")):
            if file_sha256(path) == sha256:
                return path
            log.warning("delta base %s no longer matches its hash; deleted", path)
            path.unlink(missing_ok=True)
        return None

    def keep(self, model: str, version: str, tar: Path, sha256: str) -> None:
        """Keep ``tar`` (moved, same file system) as a base of ``model`` ``version``."""
        directory = self.root / model / version
        directory.mkdir(parents=True, exist_ok=True)
        os.replace(tar, directory / f"{sha256}.tar")

    def drop(self, model: str, version: str) -> None:
        """Forget the bases kept for a release that was rolled back."""
        shutil.rmtree(self.root / model / version, ignore_errors=True)

    def retain(self, model: str, *versions: str) -> None:
        """Drop ``model``'s bases of every version but ``versions``."""
        folder = self.root / model
        if not folder.is_dir():
            return
        for directory in folder.iterdir():
            if directory.name not in versions:
                shutil.rmtree(directory, ignore_errors=True)


Fetch = Callable[[Artifact], Awaitable[Path]]


class Deltas:
    """The install steps' use of deltas: fetch an artifact by its delta, keep the bases."""

    def __init__(self, root: Path, enabled: bool, max_base_bytes: int) -> None:
        self.bases = DeltaBases(root)
        self.enabled = enabled  # [updates] keep_delta_bases
        self.max_base_bytes = max_base_bytes

    async def fetch(self, artifact: Artifact, download: Fetch) -> tuple[Path | None, int]:
        """The artifact's tar built from its delta (``staging/<sha256>.tar``), or None when
        there is no usable delta (the module docstring's conditions): the caller downloads
        the full artifact. ``download`` fetches a pinned file into staging. The second
        value is the bytes the patch cost (downloaded even when it then proved useless)."""
        delta = artifact.delta
        if delta is None or not self.enabled:
            return None, 0
        base = await asyncio.to_thread(self.bases.held, delta.base)
        if base is None:
            log.info("no base %s… held for the delta of %s", delta.base[:12], artifact.url)
            return None, 0
        try:
            patch = await download(Artifact(delta.url, delta.size, delta.sha256))
        except Exception as exc:  # the full artifact may still come: a patch is a shortcut
            log.warning("delta of %s not fetched (%s); full artifact instead", artifact.url, exc)
            return None, 0
        out = patch.parent / f"{artifact.sha256}.tar"
        try:
            await asyncio.to_thread(apply_delta, base, patch, out, delta, self.max_base_bytes)
        except (DeltaError, OSError, MemoryError) as exc:
            log.warning("delta of %s refused (%s); taking the full artifact", artifact.url, exc)
            return None, delta.size
        finally:
            patch.unlink(missing_ok=True)
        log.info("%s: patched from base %s… (%d bytes)", artifact.url, delta.base[:12], delta.size)
        return out, delta.size

    def keep(
        self,
        model: str,
        version: str,
        fetched: Iterable[tuple[Artifact, Path]],
        *,
        copy: bool = False,
    ) -> None:
        """Keep each fetched artifact's tar as a base for the next release's deltas (moved
        there, or with ``copy`` copied: the caller still reads it)."""
        if not self.enabled:
            return
        for artifact, path in fetched:
            tar = path.with_name(f"{artifact.sha256}.base.tar")
            try:
                if path.suffix == ".tar" and artifact.delta is not None:  # checked when patched
                    (shutil.copyfile if copy else os.replace)(path, tar)
                    digest = artifact.delta.tar_sha256
                else:
                    digest = gunzip_to(path, tar, self.max_base_bytes)
                self.bases.keep(model, version, tar, digest)
            except (DeltaError, OSError) as exc:  # only a later delta is lost
                tar.unlink(missing_ok=True)
                log.info("no delta base kept for %s: %s", artifact.url, exc)
