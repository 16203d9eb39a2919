"""``hub sign``: turn a model package directory into a release artifact and its signed manifest.

The artifact is a reproducible ``.tar.gz`` — entries sorted, mtime 0, owner 0/root-less, modes
normalised, gzip header without name or time — so signing the same package twice gives the same
SHA-256 and anyone can rebuild and compare it. Entries are relative to the package root
(``model.toml``, ``labels.txt`` …, no leading directory); only regular files and directories
go in, so an archive from this hub never carries a link.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import secrets
import tarfile
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from edgeagent.fleet.manifest import (
    Artifact,
    ManifestError,
    ReleaseManifest,
    Targets,
    parse_manifest,
)
from edgeagent.fleet.signing import TrustError, sign_envelope
from edgeagent.fleet.trust import TrustStore
from edgeagent.fsutil import write_file_atomic
from edgeagent.hub.keys import HubError, load_private_key
from edgeagent.models.package import ModelPackage, PackageError, load_package

DEFAULT_RELEASE_LIFETIME = timedelta(days=30)


def _entries(root: Path) -> list[Path]:
    """Every file and directory below ``root`` in sorted order; anything else is refused."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(directory) / name
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise HubError(f"{path}: links and special files cannot go into a release")
            found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _tarinfo(path: Path, root: Path) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.relative_to(root).as_posix())
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if path.is_dir():
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.type, info.mode, info.size = tarfile.REGTYPE, 0o644, path.stat().st_size
    return info


def archive_package(package_dir: str | Path) -> tuple[bytes, ModelPackage]:
    """Validate the package and return its reproducible ``.tar.gz`` bytes."""
    try:
        package = load_package(package_dir)
    except PackageError as exc:
        raise HubError(f"not a valid model package: {exc}") from exc
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for path in _entries(package.root):
            info = _tarinfo(path, package.root)
            if info.isdir():
                archive.addfile(info)
            else:
                with path.open("rb") as handle:
                    archive.addfile(info, handle)
    return buffer.getvalue(), package


def _artifact_path(out_dir: str | Path, package: ModelPackage) -> Path:
    return Path(out_dir) / f"{package.name}-{package.version}.tar.gz"


def _write_artifact(path: Path, data: bytes, *, replace: bool) -> None:
    """Unless ``replace``, a published artifact never changes: devices holding its manifest
    expect exactly these bytes, and would fail the hash check on new ones."""
    if not replace and path.exists() and path.read_bytes() != data:
        raise HubError(
            f"{path} already exists with other content; a released version never changes, "
            "so raise the version in model.toml"
        )
    write_file_atomic(path, data)


def build_artifact(
    package_dir: str | Path, out_dir: str | Path, *, replace: bool = True
) -> tuple[Path, ModelPackage]:
    """Write ``<out_dir>/<name>-<version>.tar.gz`` (see ``archive_package``)."""
    data, package = archive_package(package_dir)
    path = _artifact_path(out_dir, package)
    _write_artifact(path, data, replace=replace)
    return path, package


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
        payload = manifest.to_payload()
        try:
            parse_manifest(payload)
        except ManifestError as exc:
            raise HubError(f"cannot sign this release: {exc.message}") from exc
        return sign_envelope(payload, self.keys)


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
    now: datetime | None = None,
) -> tuple[Path, Path]:
    """Build the artifact and ``<name>-<version>.release.json`` (the signed manifest) in out_dir.

    ``key_paths`` are release keys (a threshold of them when the role needs more than one);
    ``base_url`` is where ``hub serve`` will publish ``out_dir``. With ``trust_path`` the
    envelope is verified against that trust file first, so a release signed by a key the fleet
    does not trust is caught here rather than on every device. With ``replace_artifact=False``
    (what an operator wants unless forcing) an existing artifact of the same name and version
    with other bytes is refused. Nothing is written unless every check passed. Returns
    (artifact path, envelope path).
    """
    signer = ManifestSigner(key_paths, passphrase)
    data, package = archive_package(package_dir)
    artifact = _artifact_path(out_dir, package)
    issued = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    manifest = ReleaseManifest(
        model=package.name,
        version=package.version,
        artifact=Artifact(
            url=f"{base_url.rstrip('/')}/{artifact.name}",
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        ),
        issued_at=issued,
        expires=issued + expires_in,
        deployment_id=deployment_id or f"{package.name}-{package.version}-{secrets.token_hex(4)}",
        targets=targets or Targets(),
        min_agent_version=min_agent_version,
    )
    envelope = signer(manifest)
    if trust_path is not None:
        try:
            TrustStore.load(trust_path).verify(envelope, "release")
        except TrustError as exc:
            raise HubError(f"devices trusting {trust_path} would refuse it: {exc}") from exc
    envelope_path = Path(out_dir) / f"{package.name}-{package.version}.release.json"
    _write_artifact(artifact, data, replace=replace_artifact)
    write_file_atomic(envelope_path, envelope)
    return artifact, envelope_path
