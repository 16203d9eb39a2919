"""``hub sign --delta-from``: patches from an earlier release's artifacts to the new ones.

For each artifact of the new release (the shared files, each variant) whose counterpart in the
earlier release is still in the artifact directory with its signed bytes, the patch is a zstd
frame of the new *uncompressed* tar compressed with the old tar as a raw-content dictionary
(``zstd --patch-from``; why uncompressed and why zstd: ``fleet.artifact``,
docs/fleet/deltas.md). A patch is offered only when it is at most ``max_ratio`` of the full
artifact — a device that has the base saves bytes, one that has not downloads the full file
as before. Sealed variants get none: each is encrypted under a fresh key, so no two releases
share bytes.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import zstandard

from edgeagent.fleet.agent_manifest import parse_agent_manifest
from edgeagent.fleet.artifact import Artifact, Delta
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import ManifestError, parse_manifest
from edgeagent.fleet.signing import TrustError, decode_envelope
from edgeagent.hub.keys import HubError

DEFAULT_MAX_RATIO = 0.8
LEVEL = 19  # the hub compresses once for the whole fleet: spend the CPU here
MAX_TABLE_LOG = 28  # 2^28 chain entries (1 GiB) at most, hub-side memory


def make_patch(base: bytes, target: bytes, level: int = LEVEL) -> bytes:
    """``zstd --patch-from=base``: ``target`` compressed with ``base`` as its dictionary, the
    window spanning both. The match finder's tables grow with the base: at the level's own
    sizes they index too little of a large one (an 80 MB wheelhouse whose only change was one
    wheel gave a patch of 60 % of it; with tables of 2^26/2^27 entries, 0.04 %)."""
    bits = max(len(base), len(target), 1).bit_length()
    defaults = zstandard.ZstdCompressionParameters.from_level(level)
    params = zstandard.ZstdCompressionParameters.from_level(
        level,
        window_log=max(20, min(31, (len(base) + len(target)).bit_length())),
        hash_log=max(defaults.hash_log, min(MAX_TABLE_LOG - 1, bits - 1)),
        chain_log=max(defaults.chain_log, min(MAX_TABLE_LOG, bits)),
        enable_ldm=True,
        write_content_size=True,
    )
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    return zstandard.ZstdCompressor(compression_params=params, dict_data=dictionary).compress(
        target
    )


@dataclass(frozen=True)
class DeltaFile:
    """A patch to publish beside the release's artifacts, and its manifest entry."""

    name: str
    data: bytes
    delta: Delta


def _old_payload(path: Path) -> bytes:
    try:
        return decode_envelope(path.read_bytes(), max_bytes=MAX_ENVELOPE_BYTES).payload
    except OSError as exc:
        raise HubError(f"--delta-from {path}: cannot read it ({exc.strerror})") from exc
    except TrustError as exc:
        raise HubError(f"--delta-from {path}: not a release this hub signed: {exc}") from exc


def old_release(path: Path) -> dict[str, Artifact]:
    """The artifacts of the earlier model release an operator names with ``--delta-from``
    (its ``.release.json``), by key ("shared" or a variant key); sealed variants left out."""
    try:
        old = parse_manifest(_old_payload(path))
    except ManifestError as exc:
        raise HubError(f"--delta-from {path}: not a model release: {exc}") from exc
    clear = {v.key: v.artifact for v in old.variants if v.encryption is None}
    return {"shared": old.artifact, **clear}


def old_agent_release(path: Path) -> dict[str, Artifact]:
    """The wheelhouses of the earlier agent release named with ``--delta-from``, by platform."""
    try:
        old = parse_agent_manifest(_old_payload(path))
    except ManifestError as exc:
        raise HubError(f"--delta-from {path}: not an agent release: {exc}") from exc
    return {w.platform: w.artifact for w in old.wheelhouses}


def _old_tars(pinned: Mapping[str, Artifact], directory: Path) -> dict[str, bytes]:
    """The earlier release's uncompressed tars by artifact key, for those still in
    ``directory`` with their signed bytes (a changed or missing file is skipped)."""
    tars = {}
    for key, artifact in pinned.items():
        path = directory / artifact.url.rsplit("/", 1)[-1]
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if hashlib.sha256(data).hexdigest() == artifact.sha256:
            tars[key] = gzip.decompress(data)
    return tars


def build_deltas(
    old: Mapping[str, Artifact],
    directory: Path,
    archives: Mapping[str, bytes],
    names: Mapping[str, str],
    base_url: str,
    max_ratio: float = DEFAULT_MAX_RATIO,
) -> dict[str, DeltaFile]:
    """A patch per new artifact (``archives``: key → ``.tar.gz`` bytes, ``names``: key → file
    name) from the same key of ``old`` (``old_release``, ``old_agent_release``), where it
    saves enough (``max_ratio``)."""
    if not 0 < max_ratio <= 1:
        raise HubError(f"--delta-max-ratio {max_ratio}: must be in (0, 1]")
    found = {}
    for key, base in _old_tars(old, directory).items():
        if key not in archives:
            continue
        target = gzip.decompress(archives[key])
        patch = make_patch(base, target)
        if len(patch) > max_ratio * len(archives[key]):
            continue
        base_sha = hashlib.sha256(base).hexdigest()
        name = f"{names[key]}.from-{base_sha[:16]}.zst"
        found[key] = DeltaFile(
            name,
            patch,
            Delta(
                base=base_sha,
                url=f"{base_url.rstrip('/')}/{name}",
                size=len(patch),
                sha256=hashlib.sha256(patch).hexdigest(),
                tar_size=len(target),
                tar_sha256=hashlib.sha256(target).hexdigest(),
            ),
        )
    return found
