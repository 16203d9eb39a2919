"""The hub server's gate for uploads: nothing is stored — so nothing is signed or sent — unless
every device would take it.

A server started with ``--release-key`` re-signs each upload with the fleet's key, so an upload
it did not verify would be a forgery laundered into a valid signature: the gate checks each one
with the devices' own code (``hub.release_checks``) against ``--trust``, and its serial against the
highest serial of the model the server already holds (a replay of an older release is refused;
the very same bytes again are the same row, not a replay). The trust file is read for every
upload, so a rotation (``hub rotate``) counts from the next upload without a restart. Without
``--trust`` (allowed only without a release key) the server signs nothing: it relays the
uploaded envelope, which devices verify themselves, and judges only its form, dates and serial.

Agent releases (code) are checked the same way under the trust file's ``agent`` role
(``hub.release_checks.authentic``), with their own serial floor (the model name ``edgeagent``, which
no model release may therefore use); the server never signs one, with or without a key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.fleet.signing import TrustError, keyid_of
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.release_checks import (
    AGENT_MODEL,
    AnyRelease,
    authentic,
    check_for_fleet,
    kind_of,
    model_of,
    read_manifest,
)
from edgeagent.hub.server.schema import releases


class UploadRefused(Exception):
    """An upload devices would refuse; ``code`` is the device's refusal code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def open_trust(trust_file: Path | None, keys: Sequence[Ed25519PrivateKey] = ()) -> None:
    """Check at start that ``trust_file`` is a valid trust file and that it authorises the
    release ``keys`` (else every envelope the server signs would be refused by every device);
    ``ValueError`` naming the flag otherwise."""
    if trust_file is None:
        return
    try:
        store = TrustStore.load(trust_file)
    except TrustError as exc:
        raise ValueError(f"--trust {trust_file}: {exc}") from exc
    role = store.root.roles["release"]
    trusted = {keyid_of(key.public_key()) for key in keys} & role.keyids
    if keys and len(trusted) < role.threshold:
        raise ValueError(
            f"--release-key: {len(trusted)} of the keys are release keys of --trust "
            f"{trust_file}, which needs {role.threshold}: devices would refuse what the "
            "server signs"
        )


async def check_upload(
    connection: AsyncConnection, envelope: bytes, trust_file: Path | None
) -> AnyRelease:
    """The manifest (a model's or the agent's) of an upload that devices trusting
    ``trust_file`` would install over every release of its model on this server;
    ``UploadRefused`` otherwise (nothing is written)."""
    try:
        if trust_file is None:
            manifest = read_manifest(envelope)
        else:
            manifest = authentic(envelope, TrustStore.load(trust_file))
    except TrustError as exc:
        raise UploadRefused(exc.code, f"devices would refuse this release: {exc}") from exc
    model = model_of(manifest)
    if kind_of(manifest) == "model" and model == AGENT_MODEL:
        raise UploadRefused(
            "reserved_name",
            f"the model name {AGENT_MODEL!r} is reserved for agent releases (hub sign --agent)",
        )
    floor = await serial_floor(connection, model, hashlib.sha256(envelope).hexdigest())
    try:
        check_for_fleet(manifest, serial_floor=floor)
    except TrustError as exc:
        held = "" if floor is None else f" (this hub holds {model} serial {floor})"
        raise UploadRefused(exc.code, f"devices would refuse this release: {exc}{held}") from exc
    return manifest


async def serial_floor(connection: AsyncConnection, model: str, except_sha256: str) -> int | None:
    """The highest serial among the stored releases of ``model`` (``edgeagent``: the agent's)
    other than the envelope with ``except_sha256`` (None when there is none). Every envelope
    the server sends carries the serial of a stored release, so this is also the highest it
    has sent."""
    rows = await connection.execute(
        sa.select(releases.c.envelope).where(
            releases.c.model == model, releases.c.sha256 != except_sha256
        )
    )
    serials = [read_manifest(row[0], max_bytes=len(row[0])).serial for row in rows]
    return max(serials, default=None)
