"""``hub sign --agent``: wheelhouses of the agent into a signed agent release.

A wheelhouse is a directory of wheels — the agent's and every dependency it needs on one
platform, e.g. ``pip wheel . -w wh/`` on (or cross-built for) that platform — packed into one
reproducible tarball. The release (``fleet.agent_manifest``) names one tarball per platform,
the Python version they were built for and the next serial of the ``edgeagent`` counter, and is
signed by the *agent* key(s): the trust file's ``agent`` role, which the model release key is
not part of. With a trust file the envelope is verified as devices will before anything but
the serial counter is written.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from edgeagent.fleet.agent_manifest import (
    AgentManifest,
    Wheelhouse,
    parse_agent_manifest,
    this_python,
)
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import Artifact, ManifestError, Targets
from edgeagent.fleet.signing import TrustError, sign_envelope
from edgeagent.fleet.trust import TrustStore
from edgeagent.fsutil import write_file_atomic
from edgeagent.hub.keys import HubError, load_private_key
from edgeagent.hub.serials import ReleaseSerials, serials_path_for
from edgeagent.hub.sign import DEFAULT_RELEASE_LIFETIME, _tar

SERIAL_NAME = "edgeagent"  # the agent's serial counter (beside the models')
_AGENT_WHEEL_RE = re.compile(r"\Aedgeagent-([0-9]+(?:\.[0-9]+){0,2})-.*\.whl\Z")


def agent_version_of(directory: Path) -> str:
    """The version of the single agent wheel in ``directory``."""
    found = {m.group(1) for p in directory.glob("*.whl") if (m := _AGENT_WHEEL_RE.match(p.name))}
    if len(found) != 1:
        raise HubError(
            f"{directory}: needs exactly one edgeagent-<version>-*.whl, found "
            f"{sorted(found) or 'none'} (build it with 'pip wheel . -w {directory}')"
        )
    return found.pop()


def wheelhouse_tar(directory: Path) -> bytes:
    """Every ``*.whl`` of ``directory`` in a reproducible tar.gz (nothing else goes in)."""
    wheels = sorted(directory.glob("*.whl"))
    if any(p.is_symlink() or not p.is_file() for p in wheels):
        raise HubError(f"{directory}: wheels must be regular files")
    return _tar({p.name: p.read_bytes() for p in wheels})


def sign_agent_release(
    wheelhouses: Mapping[str, Path],
    *,
    key_paths: Sequence[str | Path],
    base_url: str,
    out_dir: Path,
    python: str | None = None,
    targets: Targets | None = None,
    expires_in: timedelta = DEFAULT_RELEASE_LIFETIME,
    deployment_id: str | None = None,
    serials: ReleaseSerials | None = None,
    trust_path: Path | None = None,
    passphrase: bytes | None = None,
    now: datetime | None = None,
) -> Path:
    """Write one tarball per platform and ``edgeagent-<version>.agent-release.json``; return
    the envelope's path. ``wheelhouses`` maps platform tags (``linux_aarch64``) to wheel
    directories, all holding the same agent version."""
    if not wheelhouses:
        raise HubError("an agent release needs at least one wheelhouse")
    keys = [load_private_key(p, passphrase) for p in key_paths]
    if not keys:
        raise HubError("signing an agent release needs the agent key(s) (--key)")
    versions = {agent_version_of(Path(d)) for d in wheelhouses.values()}
    if len(versions) != 1:
        raise HubError(f"the wheelhouses hold different agent versions: {sorted(versions)}")
    version = versions.pop()
    data = {tag: wheelhouse_tar(Path(d)) for tag, d in sorted(wheelhouses.items())}
    names = {tag: f"edgeagent-{version}-{tag}.wheelhouse.tar.gz" for tag in data}
    base = base_url.rstrip("/")
    counter = serials or ReleaseSerials(serials_path_for(key_paths[0]))
    issued = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    manifest = AgentManifest(
        version=version,
        serial=counter.next(SERIAL_NAME),
        python=python or this_python(),
        wheelhouses=tuple(
            Wheelhouse(
                tag,
                Artifact(f"{base}/{names[tag]}", len(blob), hashlib.sha256(blob).hexdigest()),
            )
            for tag, blob in data.items()
        ),
        issued_at=issued,
        expires=issued + expires_in,
        deployment_id=deployment_id or f"agent-{version}-{secrets.token_hex(4)}",
        targets=targets or Targets(),
    )
    payload = manifest.to_payload()
    try:
        parse_agent_manifest(payload)
    except ManifestError as exc:
        raise HubError(f"cannot sign this agent release: {exc.message}") from exc
    envelope = sign_envelope(payload, keys)
    if len(envelope) > MAX_ENVELOPE_BYTES:
        raise HubError(f"the signed agent release is {len(envelope)} bytes, too large")
    if trust_path is not None:
        try:
            TrustStore.load(trust_path).verify(envelope, "agent")
        except TrustError as exc:
            raise HubError(f"devices trusting {trust_path} would refuse it: {exc}") from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    for tag, blob in data.items():
        write_file_atomic(out_dir / names[tag], blob)
    path = out_dir / f"edgeagent-{version}.agent-release.json"
    write_file_atomic(path, envelope)
    return path
