"""A pinned download in a signed release, and the delta that may stand in for it.

An ``Artifact`` is what the manifest promises about one file: URL, exact size, SHA-256, so a
download is capped at the signed length and checked before it is unpacked.

A ``Delta`` (optional, beside an artifact's hash) lets a device that still holds an earlier
release's archive download a patch instead of the whole file. Artifacts are ``.tar.gz``; a
binary diff of two gzip streams is useless once the bytes before the change shift (measured:
a head retrain with a 10-class head gave a delta as large as the file), so a delta works on
the *uncompressed* tar streams: ``base`` is the SHA-256 of the base archive's tar, the patch
(``url``, ``size``, ``sha256``) is a zstd frame compressed with that tar as its raw-content
dictionary (``zstd --patch-from``), and ``tar_size`` / ``tar_sha256`` pin the tar it must
produce. The device checks the base's hash before using it and the result's hash before
anything else reads it, and takes the full artifact whenever either fails
(``updates.deltas``). ``docs/fleet/deltas.md`` has the measurements behind the choice of zstd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edgeagent.fleet.wire import Reader, is_object

__all__ = ["ALGORITHM", "Artifact", "Delta", "artifact_dict", "read_artifact"]

ALGORITHM = "zstd-patch"  # zstd frame, dictionary = the base's uncompressed tar
MAX_URL_CHARS = 2048
_PIN = frozenset({"url", "size", "sha256"})
_DELTA_FIELDS = _PIN | {"base", "algorithm", "tar_size", "tar_sha256"}


@dataclass(frozen=True)
class Delta:
    """A patch from the tar whose SHA-256 is ``base`` to the tar the artifact holds."""

    base: str  # SHA-256 of the base archive's uncompressed tar
    url: str
    size: int  # of the patch
    sha256: str  # of the patch
    tar_size: int  # of the result: the artifact's uncompressed tar
    tar_sha256: str
    algorithm: str = ALGORITHM

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "algorithm": self.algorithm,
            "url": self.url,
            "size": self.size,
            "sha256": self.sha256,
            "tar_size": self.tar_size,
            "tar_sha256": self.tar_sha256,
        }


@dataclass(frozen=True)
class Artifact:
    url: str
    size: int
    sha256: str
    delta: Delta | None = None  # written only when set: a release without one signs as before


def artifact_dict(artifact: Artifact) -> dict[str, Any]:
    pinned: dict[str, Any] = {"url": artifact.url, "size": artifact.size, "sha256": artifact.sha256}
    if artifact.delta is not None:
        pinned["delta"] = artifact.delta.to_dict()
    return pinned


def _positive(reader: Reader, value: Any, where: str) -> int:
    return reader.integer(value, where, 1, math.inf, "a positive integer")


def read_artifact(
    reader: Reader, value: Any, where: str = "artifact", extra: frozenset[str] = frozenset()
) -> Artifact:
    """A pinned download: ``url``, ``size`` and ``sha256`` (and an optional ``delta``), beside
    the ``extra`` keys of the object it is part of (a variant's runtime, a wheelhouse's
    platform)."""
    has_delta = is_object(value) and "delta" in value
    item = reader.exact_object(value, where, _PIN | extra | ({"delta"} if has_delta else set()))
    return Artifact(
        url=reader.url(item["url"], f"{where}.url", MAX_URL_CHARS),
        size=_positive(reader, item["size"], f"{where}.size"),
        sha256=reader.digest(item["sha256"], "sha256"),
        delta=_delta(reader, item["delta"], f"{where}.delta") if has_delta else None,
    )


def _delta(reader: Reader, value: Any, where: str) -> Delta:
    item = reader.exact_object(value, where, _DELTA_FIELDS)
    if item["algorithm"] != ALGORITHM:
        raise reader.fail(
            f"{where}.algorithm", f"{str(item['algorithm'])[:40]!r} is not {ALGORITHM!r}"
        )
    return Delta(
        base=reader.digest(item["base"], f"{where}.base"),
        url=reader.url(item["url"], f"{where}.url", MAX_URL_CHARS),
        size=_positive(reader, item["size"], f"{where}.size"),
        sha256=reader.digest(item["sha256"], f"{where}.sha256"),
        tar_size=_positive(reader, item["tar_size"], f"{where}.tar_size"),
        tar_sha256=reader.digest(item["tar_sha256"], f"{where}.tar_sha256"),
    )
