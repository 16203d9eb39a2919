"""``hub sign``: turn a model package directory into release artifacts and a signed manifest.

Release format 2 ships a package as one archive of the shared files devices need (model.toml,
labels, golden inputs: the package's ``device_files``; held-out and evaluation data stay here)
plus one archive per variant, so a device downloads only the variant it runs and what it needs.
Each artifact is a reproducible ``.tar.gz`` — entries sorted, mtime 0, owner 0/root-less, modes
normalised, gzip header without name or time — so signing the same package twice gives the same
SHA-256 and anyone can rebuild and compare it. Entries are relative to the package root
(``model.toml``, ``labels.txt`` …, no leading directory); only regular files go in, so an
archive from this hub never carries a link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import os
import secrets
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import BinaryIO

from edgeagent.fleet.cancel import Cancellation, parse_cancellation
from edgeagent.fleet.encryption import Encryption
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import (
    Artifact,
    ManifestError,
    ReleaseManifest,
    Targets,
    VariantArtifact,
    parse_manifest,
)
from edgeagent.fleet.release_canary import ReleaseCanary
from edgeagent.fleet.signing import TrustError, decode_envelope, sign_envelope
from edgeagent.fleet.trust import TrustStore
from edgeagent.fleet.windows import MaintenanceWindow
from edgeagent.fsutil import write_file_atomic
from edgeagent.hub.deltas import DEFAULT_MAX_RATIO, build_deltas, old_release
from edgeagent.hub.encrypt import Recipients, for_targets, seal_variant
from edgeagent.hub.keys import HubError, load_private_key
from edgeagent.hub.serials import ReleaseSerials, serials_path_for
from edgeagent.models.package import ModelPackage, PackageError, file_sha256, load_package

DEFAULT_RELEASE_LIFETIME = timedelta(days=30)


def _entries(root: Path) -> list[Path]:
    """Every file below ``root`` in sorted order; links and special files are refused."""
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise HubError(f"{path}: links and special files cannot go into a release")
            if path.is_file():
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _files(root: Path, files: Sequence[Path]) -> dict[str, Path]:
    """Archive entries for ``files``, named relative to ``root`` (read while archiving)."""
    return {path.relative_to(root).as_posix(): path for path in files}


def _write_tar(entries: Mapping[str, bytes | Path], out: BinaryIO) -> None:
    """A reproducible ``.tar.gz`` of ``entries`` (name → bytes, or a file streamed from disk
    so a multi-GB model never sits in memory; the unpacker makes the directories)."""
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for name in sorted(entries):
            entry = entries[name]
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            size = entry.stat().st_size if isinstance(entry, Path) else len(entry)
            info.type, info.mode, info.size = tarfile.REGTYPE, 0o644, size
            with entry.open("rb") if isinstance(entry, Path) else io.BytesIO(entry) as data:
                archive.addfile(info, data)


def _tar(entries: Mapping[str, bytes | Path]) -> bytes:
    """``_write_tar`` into memory (small archives: an agent's wheelhouse index, tests)."""
    buffer = io.BytesIO()
    _write_tar(entries, buffer)
    return buffer.getvalue()


@dataclass(frozen=True)
class ArchiveFile:
    """One artifact written to a working file: what its manifest entry records."""

    path: Path
    size: int
    sha256: str


def _tar_file(entries: Mapping[str, bytes | Path], path: Path) -> ArchiveFile:
    with path.open("wb") as out:
        _write_tar(entries, out)
        out.flush()
        os.fsync(out.fileno())
    return ArchiveFile(path, path.stat().st_size, file_sha256(path))


SHARED = "shared"  # the key of the shared files' artifact beside the variant keys
# What the packager and the zoo builder leave in a package for the hub's eyes only: held-out
# and evaluation data, validation and accuracy reports, the build key. A package that does
# not declare its ``device_files`` still never ships these.
HUB_ONLY_FILES = frozenset(
    {"heldout.npz", "validation.json", "evaluation.json", "accuracy.json", "build.json"}
)


def device_needs(package: ModelPackage, variant_keys: Sequence[str]) -> list[Path]:
    """What a device running ``variant_keys`` needs of the package: model.toml, the files it
    names (labels, golden inputs, anchors), its declared device files and those variants'
    files — the denominator of the bytes-per-device goal (at most 1.05× what it serves)."""
    files = [package.root / "model.toml", *package.named_files, *(package.device_files or ())]
    files += [path for v in package.variants if v.key in variant_keys for path in v.files]
    return list(dict.fromkeys(files))


def device_shared_files(package: ModelPackage, entries: Sequence[Path]) -> list[Path]:
    """The files of the shared archive: model.toml and the package's ``device_files`` when it
    declares them; else every file no variant lists, less the known hub-only ones."""
    if package.device_files is not None:
        wanted = {package.root / "model.toml", *package.device_files}
        return [path for path in entries if path in wanted]
    in_variants = {path for variant in package.variants for path in variant.files}
    hub_only = {package.root / name for name in HUB_ONLY_FILES}
    return [path for path in entries if path not in in_variants and path not in hub_only]


@dataclass(frozen=True)
class PackageArchives:
    """A package split the way release format 2 ships it: the shared files devices need
    (model.toml, labels, golden inputs: ``device_shared_files``) and one archive per variant."""

    package: ModelPackage
    shared: ArchiveFile
    variants: dict[str, ArchiveFile]  # Variant.key ("onnxruntime/int8") → its archive
    encryption: dict[str, Encryption] = dataclasses.field(default_factory=dict)  # sealed ones

    def names(self) -> dict[str, str]:
        """Artifact file names: ``<name>-<version>.tar.gz`` for the shared files and
        ``<name>-<version>.<runtime>.<precision>[.sealed].tar.gz`` per variant."""
        stem = f"{self.package.name}-{self.package.version}"
        names = {SHARED: f"{stem}.tar.gz"}
        for key in self.variants:
            sealed = ".sealed" if key in self.encryption else ""
            names[key] = f"{stem}.{key.replace('/', '.')}{sealed}.tar.gz"
        return names

    def data(self) -> dict[str, ArchiveFile]:
        return {SHARED: self.shared, **self.variants}


def archive_package(
    package_dir: str | Path, work: Path, recipients: Recipients | None = None
) -> PackageArchives:
    """Validate the package and write its archives into ``work`` (see ``PackageArchives``):
    reproducible, except that with ``recipients`` each variant is sealed for them under a
    fresh key (``hub.encrypt``), which by design never gives the same bytes twice."""
    try:
        package = load_package(package_dir)
    except PackageError as exc:
        raise HubError(f"not a valid model package: {exc}") from exc
    shared = device_shared_files(package, _entries(package.root))
    variants, encryption = {}, {}
    for variant in package.variants:
        target = work / variant.key.replace("/", ".")
        if recipients is None:
            variants[variant.key] = _tar_file(_files(package.root, variant.files), target)
        else:
            sealed, encryption[variant.key] = seal_variant(package, variant, recipients)
            variants[variant.key] = _tar_file(sealed, target)
    shared_file = _tar_file(_files(package.root, shared), work / SHARED)
    return PackageArchives(package, shared_file, variants, encryption)


def _check_artifact(path: Path, archive: ArchiveFile, *, replace: bool) -> None:
    """Unless ``replace``, a published artifact never changes: devices holding its manifest
    expect exactly these bytes, and would fail the hash check on new ones."""
    if not replace and path.exists() and file_sha256(path) != archive.sha256:
        raise HubError(
            f"{path} already exists with other content; a released version never changes, "
            "so raise the version in model.toml"
        )


def _publish(path: Path, archive: ArchiveFile) -> None:
    """Move the finished archive into place (one rename: never half an artifact there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(archive.path, path)


@contextlib.contextmanager
def _work_dir(out_dir: str | Path) -> Iterator[Path]:
    """Where archives are written before they are published: beside ``out_dir`` on its file
    system (a rename publishes them), without creating ``out_dir`` before every check passed."""
    existing = Path(out_dir).absolute()
    while not existing.is_dir():
        existing = existing.parent
    with tempfile.TemporaryDirectory(dir=existing, prefix=".edgeagent-archives-") as work:
        yield Path(work)


def build_artifacts(
    package_dir: str | Path, out_dir: str | Path, *, replace: bool = True
) -> tuple[dict[str, Path], ModelPackage]:
    """Write every artifact of the package into ``out_dir``; {"shared" | variant key: path}."""
    with _work_dir(out_dir) as work:
        archives = archive_package(package_dir, work)
        paths = {key: Path(out_dir) / name for key, name in archives.names().items()}
        for key, path in paths.items():
            _check_artifact(path, archives.data()[key], replace=replace)
        for key, path in paths.items():
            _publish(path, archives.data()[key])
    return paths, archives.package


class ManifestSigner:
    """Signs release manifests with the hub's release key(s), checking each one parses first.

    A rollout signs one envelope per stage (``targets.device_ids`` = that stage's devices), so
    the keys are loaded once and kept for the whole run.
    """

    def __init__(self, key_paths: Sequence[str | Path], passphrase: bytes | None = None) -> None:
        self.keys = [load_private_key(p, passphrase) for p in key_paths]
        if not self.keys:
            raise HubError("signing needs at least one release key (--key)")

    def __call__(self, manifest: ReleaseManifest) -> bytes:
        envelope = self._signed(manifest.to_payload(), parse_manifest, "release")
        if len(envelope) > MAX_ENVELOPE_BYTES:  # what devices and the broker accept by default
            raise HubError(
                f"the signed release is {len(envelope)} bytes, over the {MAX_ENVELOPE_BYTES} "
                "devices accept; an encrypted one carries a wrapped key per recipient and "
                "variant: seal it for fewer devices at a time (--device-id)"
            )
        return envelope

    def cancellation(self, cancellation: Cancellation) -> bytes:
        """A cancellation of releases these keys signed (``fleet.cancel``)."""
        return self._signed(cancellation.to_payload(), parse_cancellation, "cancellation")

    def _signed(self, payload: bytes, parse: Callable[[bytes], object], what: str) -> bytes:
        """``payload`` signed, once devices' own parser takes it."""
        try:
            parse(payload)
        except ManifestError as exc:
            raise HubError(f"cannot sign this {what}: {exc.message}") from exc
        return sign_envelope(payload, self.keys)


def release_path(out_dir: str | Path, model: str, version: str) -> Path:
    """``<out_dir>/<model>-<version>.release.json``: the envelope signed last for that version."""
    return Path(out_dir) / f"{model}-{version}.release.json"


def _check_against(envelope: bytes, trust_path: str | Path | None) -> None:
    """With a trust file, refuse an envelope that devices trusting it would refuse."""
    if trust_path is None:
        return
    try:
        TrustStore.load(trust_path).verify(envelope, "release")
    except TrustError as exc:
        raise HubError(f"devices trusting {trust_path} would refuse it: {exc}") from exc


def sign_package(
    package_dir: str | Path,
    *,
    key_paths: Sequence[str | Path],
    base_url: str,
    out_dir: str | Path = ".",
    targets: Targets | None = None,
    expires_in: timedelta = DEFAULT_RELEASE_LIFETIME,
    deployment_id: str | None = None,
    min_agent_version: str = "0.0.0",
    passphrase: bytes | None = None,
    trust_path: str | Path | None = None,
    replace_artifact: bool = True,
    serials: ReleaseSerials | None = None,
    recipients: Recipients | None = None,
    now: datetime | None = None,
    canary: ReleaseCanary | None = None,
    delta_from: Path | None = None,
    delta_max_ratio: float = DEFAULT_MAX_RATIO,
    window: MaintenanceWindow | None = None,
) -> tuple[Path, Path]:
    """Build the artifacts and ``<name>-<version>.release.json`` (the signed manifest) in out_dir.

    ``key_paths`` are release keys (a threshold of them when the role needs more than one);
    ``base_url`` is where ``hub serve`` will publish ``out_dir``. The release takes the model's
    next serial from ``serials`` (default: ``serials.json`` beside the first key). With
    ``trust_path`` the envelope is verified against that trust file first, so a release signed
    by a key the fleet does not trust is caught here rather than on every device. With
    ``replace_artifact=False`` (what an operator wants unless forcing) an existing artifact of
    the same name and version with other bytes is refused. Nothing but the serial counter is
    written unless every check passed. With ``recipients`` (device id → X25519 public key)
    every variant is sealed, for the release's target devices when it names some (each must
    be a recipient) or else for all of them. With ``canary`` the device judges the new
    version on live traffic before committing it. With ``delta_from`` (an earlier
    ``.release.json`` whose artifacts are in ``out_dir``) each artifact also names a patch
    from that release's (``hub.deltas``; kept only when at most ``delta_max_ratio`` of it).
    With ``window`` devices take it only inside that maintenance window (``fleet.windows``).
    Returns (shared artifact path, envelope path).
    """
    signer = ManifestSigner(key_paths, passphrase)
    wrapped_for = None if recipients is None else for_targets(recipients, targets or Targets())
    with _work_dir(out_dir) as work:
        archives = archive_package(package_dir, work, wrapped_for)
        return _sign_archives(
            archives,
            signer,
            base_url=base_url,
            out_dir=Path(out_dir),
            targets=targets,
            expires_in=expires_in,
            deployment_id=deployment_id,
            min_agent_version=min_agent_version,
            trust_path=trust_path,
            replace_artifact=replace_artifact,
            counter=serials or ReleaseSerials(serials_path_for(key_paths[0])),
            now=now,
            canary=canary,
            delta_from=delta_from,
            delta_max_ratio=delta_max_ratio,
            window=window,
        )


def _sign_archives(
    archives: PackageArchives,
    signer: ManifestSigner,
    *,
    base_url: str,
    out_dir: Path,
    targets: Targets | None,
    expires_in: timedelta,
    deployment_id: str | None,
    min_agent_version: str,
    trust_path: str | Path | None,
    replace_artifact: bool,
    counter: ReleaseSerials,
    now: datetime | None,
    canary: ReleaseCanary | None,
    delta_from: Path | None = None,
    delta_max_ratio: float = DEFAULT_MAX_RATIO,
    window: MaintenanceWindow | None = None,
) -> tuple[Path, Path]:
    """``sign_package`` once its archives are written (in a working folder in ``out_dir``)."""
    package, names, data = archives.package, archives.names(), archives.data()
    base = base_url.rstrip("/")
    deltas = {}
    if delta_from is not None:  # the patches need the archives' bytes (hub side only)
        blobs = {key: archive.path.read_bytes() for key, archive in data.items()}
        deltas = build_deltas(old_release(delta_from), out_dir, blobs, names, base, delta_max_ratio)

    def artifact(key: str) -> Artifact:
        patch = deltas[key].delta if key in deltas else None
        return Artifact(f"{base}/{names[key]}", data[key].size, data[key].sha256, patch)

    issued = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    manifest = ReleaseManifest(
        model=package.name,
        version=package.version,
        serial=counter.next(package.name),
        artifact=artifact(SHARED),
        variants=tuple(
            VariantArtifact(v.runtime, v.precision, artifact(v.key), archives.encryption.get(v.key))
            for v in package.variants
        ),
        issued_at=issued,
        expires=issued + expires_in,
        deployment_id=deployment_id or f"{package.name}-{package.version}-{secrets.token_hex(4)}",
        targets=targets or Targets(),
        min_agent_version=min_agent_version,
        canary=canary,
        window=window,
    )
    envelope = signer(manifest)
    _check_against(envelope, trust_path)
    envelope_path = release_path(out_dir, package.name, package.version)
    for key, name in names.items():
        _check_artifact(out_dir / name, data[key], replace=replace_artifact)
    for key, name in names.items():
        _publish(out_dir / name, data[key])
    for patch in deltas.values():
        write_file_atomic(out_dir / patch.name, patch.data)
    write_file_atomic(envelope_path, envelope)
    return out_dir / names[SHARED], envelope_path


def sign_rollback(
    model: str,
    version: str,
    *,
    key_paths: Sequence[str | Path],
    out_dir: str | Path,
    expires_in: timedelta = DEFAULT_RELEASE_LIFETIME,
    passphrase: bytes | None = None,
    trust_path: str | Path | None = None,
    serials: ReleaseSerials | None = None,
    now: datetime | None = None,
) -> tuple[ReleaseManifest, bytes]:
    """Sign ``model`` ``version`` again, from the artifacts kept in ``out_dir``, as a new release.

    The new envelope pins the same artifact (URL, size, SHA-256 — checked against the file
    still in ``out_dir``, so a rollback never points devices at bytes that are gone) with the
    model's next serial, a fresh issue time, expiry and deployment id: devices that committed a
    later version install it, and the old envelope of that version stays a refused replay.
    It replaces ``<model>-<version>.release.json``. Returns (manifest, envelope).
    """
    signer = ManifestSigner(key_paths, passphrase)
    kept = release_path(out_dir, model, version)
    try:
        old = parse_manifest(
            decode_envelope(kept.read_bytes(), max_bytes=MAX_ENVELOPE_BYTES).payload
        )
    except OSError as exc:
        raise HubError(
            f"{kept}: no kept release of {model} {version} to roll back to ({exc.strerror})"
        ) from exc
    except TrustError as exc:
        raise HubError(f"{kept}: not a release this hub can re-sign: {exc}") from exc
    if (old.model, old.version) != (model, version):
        raise HubError(f"{kept} holds {old.model} {old.version}, not {model} {version}")
    for kept_artifact in (old.artifact, *(v.artifact for v in old.variants)):
        _check_kept_artifact(Path(out_dir), kept_artifact)
    counter = serials or ReleaseSerials(serials_path_for(key_paths[0]))
    issued = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    manifest = dataclasses.replace(
        old,
        serial=counter.next(model),
        issued_at=issued,
        expires=issued + expires_in,
        deployment_id=f"{model}-{version}-rollback-{secrets.token_hex(4)}",
    )
    envelope = signer(manifest)
    _check_against(envelope, trust_path)
    write_file_atomic(kept, envelope)
    return manifest, envelope


def _check_kept_artifact(out_dir: Path, artifact: Artifact) -> None:
    """The artifact a rollback points at must still be in ``out_dir`` with the signed bytes."""
    path = out_dir / artifact.url.rsplit("/", 1)[-1]
    try:
        size, digest = path.stat().st_size, file_sha256(path)
    except OSError as exc:
        raise HubError(f"{path}: the artifact to roll back to is gone ({exc.strerror})") from exc
    if size != artifact.size or digest != artifact.sha256:
        raise HubError(f"{path}: no longer the signed artifact (size or SHA-256 differ)")
