"""Releases as durable rows, and the serial counter every release the hub sends is checked
against.

A release (a model's or the agent's) is stored once, as uploaded and verified; the API and the
dashboard show it without its envelope (``release_view``), which has its own route.

Serials: devices refuse a release whose serial is not above the one they hold, so the server
keeps a counter per model (``model_serials``: above every serial it signed, sent or received)
and, when it signs (``--release-key``), takes each envelope's serial from it (``next_serial``)
in the transaction that records what it will send. A rollback is then the old manifest
re-issued: a fresh serial and lifetime, which devices accept. Without a key the server can only
relay uploads, so it refuses a deployment whose serial is not above one it already sent
(``check_serial``): devices would refuse it as a replay. Agent releases (code) are always
relayed, after the same check, whatever keys the server holds.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.fleet.agent_manifest import AgentManifest
from edgeagent.fleet.manifest import MAX_SERIAL
from edgeagent.hub.release_checks import AnyRelease, kind_of, model_of, read_manifest
from edgeagent.hub.server.schema import deployment_devices, deployments, model_serials, releases


class DeploymentError(Exception):
    """A request the deployment state machine or the serial check refuses; ``status`` is the
    HTTP status it maps to."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def add_release(
    connection: AsyncConnection, envelope: bytes, manifest: AnyRelease
) -> tuple[dict[str, Any], bool]:
    """Store a verified release (a model's or the agent's) once (same bytes → same row);
    returns (row, created)."""
    digest = hashlib.sha256(envelope).hexdigest()
    found = await one_row(connection, sa.select(releases).where(releases.c.sha256 == digest))
    if found is not None:
        return found, False
    covers = (  # what an agent release can be installed on (GET releases shows it)
        {"platforms": [w.platform for w in manifest.wheelhouses], "python": manifest.python}
        if isinstance(manifest, AgentManifest)
        else {}
    )
    await connection.execute(
        releases.insert().values(
            kind=kind_of(manifest),
            model=model_of(manifest),
            version=manifest.version,
            release_tag=manifest.deployment_id,
            sha256=digest,
            envelope=envelope,
            **covers,
            created_at=time.time(),
        )
    )
    await note_serial(connection, model_of(manifest), manifest.serial)
    created = await one_row(connection, sa.select(releases).where(releases.c.sha256 == digest))
    assert created is not None
    return created, True


def release_manifest(envelope: bytes) -> AnyRelease:
    """The manifest of a stored envelope (checked when it was uploaded)."""
    return read_manifest(envelope, max_bytes=len(envelope))


def _insert_serial(connection: AsyncConnection, model: str, serial: int) -> Any:
    dialect = sqlite if connection.dialect.name == "sqlite" else postgresql
    return dialect.insert(model_serials).values(model=model, serial=serial)


async def note_serial(connection: AsyncConnection, model: str, serial: int) -> None:
    """Raise the counter of ``model`` to at least ``serial`` (a release the server received)."""
    insert = _insert_serial(connection, model, serial)
    held, new = model_serials.c.serial, insert.excluded.serial
    await connection.execute(
        insert.on_conflict_do_update(
            index_elements=["model"], set_={"serial": sa.case((held < new, new), else_=held)}
        )
    )


async def next_serial(connection: AsyncConnection, model: str) -> int:
    """The next serial of ``model``, above every serial the server signed, sent or received
    for it; taken in the caller's transaction, so it is committed with what records it (or
    not at all) and before anything signed with it is sent."""
    insert = _insert_serial(connection, model, 1)
    serial = await connection.scalar(
        insert.on_conflict_do_update(
            index_elements=["model"], set_={"serial": model_serials.c.serial + 1}
        ).returning(model_serials.c.serial)
    )
    if serial is None or serial > MAX_SERIAL:
        raise DeploymentError(409, f"{model} has used every release serial (2^53-1)")
    return int(serial)


async def sent_serial(
    connection: AsyncConnection,
    model: str,
    *,
    other_than: str | None = None,
    relayed_only: bool = False,
) -> int | None:
    """The highest serial recorded as sent (or about to be) to a device for ``model``, by any
    deployment but ``other_than``; ``relayed_only``: only uploads sent unchanged."""
    dd = deployment_devices
    joined = dd.join(deployments, deployments.c.id == dd.c.deployment_id)
    query = sa.select(sa.func.max(dd.c.serial)).where(
        deployments.c.model == model, dd.c.serial.is_not(None)
    )
    if other_than is not None:
        query = query.where(deployments.c.id != other_than)
    if relayed_only:
        joined = joined.join(releases, releases.c.id == deployments.c.release_id)
        query = query.where(dd.c.envelope_sha256 == releases.c.sha256)
    value = await connection.scalar(query.select_from(joined))
    return None if value is None else int(value)


async def _sent_with(connection: AsyncConnection, release: dict[str, Any], serial: int) -> bool:
    """Whether ``serial`` went out in this release's own uploaded envelope."""
    dd = deployment_devices
    query = (
        sa.select(dd.c.device_id)
        .join(deployments, deployments.c.id == dd.c.deployment_id)
        .where(
            deployments.c.model == release["model"],
            dd.c.serial == serial,
            dd.c.envelope_sha256 == hashlib.sha256(release["envelope"]).hexdigest(),
        )
        .limit(1)
    )
    return await connection.scalar(query) is not None


async def check_serial(
    connection: AsyncConnection,
    release: dict[str, Any],
    *,
    other_than: str | None = None,
    relayed_only: bool = False,
    rollback: bool = False,
    serial: int | None = None,
) -> None:
    """The server serial check before send, for a server that relays uploads unchanged: 409
    unless the release's serial is above every serial already sent for its model, or it is
    the very envelope that carried the highest one (a retry: devices that failed it never
    raised their floor and take it again; those that committed it answer ``same_version``).
    ``serial``: the release's own, when the caller has its manifest parsed already."""
    if serial is None:
        serial = release_manifest(release["envelope"]).serial
    floor = await sent_serial(
        connection, release["model"], other_than=other_than, relayed_only=relayed_only
    )
    if floor is None or serial > floor:
        return
    if serial == floor and await _sent_with(connection, release, serial):
        return
    what = f"{release['model']} {release['version']} carries serial {serial}"
    if release.get("kind") == "agent":  # never signed by the server, whatever its keys
        fix = "sign it again with a new serial (hub sign --agent) and upload it"
    elif rollback:
        fix = (
            "a rollback needs --release-key (the server re-signs the old release with a fresh "
            "serial), or upload that version signed again with a new serial (hub sign)"
        )
    else:
        fix = (
            "sign it again with a new serial (hub sign) and upload it, or run the server "
            "with --release-key to sign what it sends with fresh serials"
        )
    raise DeploymentError(
        409,
        f"{what}, not above serial {floor} this server already sent for {release['model']}: "
        f"devices would refuse it as a replay; {fix}",
    )


def release_view(row: dict[str, Any]) -> dict[str, Any]:
    """A release as the API shows it (the envelope has its own route)."""
    return {k: v for k, v in row.items() if k != "envelope"}


async def get_release(connection: AsyncConnection, release_id: int) -> dict[str, Any] | None:
    return await one_row(connection, sa.select(releases).where(releases.c.id == release_id))


async def find_release(
    connection: AsyncConnection, model: str, version: str
) -> dict[str, Any] | None:
    """The newest stored release of ``model`` at ``version``."""
    query = (
        sa.select(releases)
        .where(releases.c.model == model, releases.c.version == version)
        .order_by(releases.c.id.desc())
    )
    return await one_row(connection, query)


async def list_releases(connection: AsyncConnection, model: str = "") -> list[dict[str, Any]]:
    query = sa.select(releases).order_by(releases.c.id.desc())
    if model:
        query = query.where(releases.c.model == model)
    return [release_view(dict(r._mapping)) for r in await connection.execute(query)]


async def one_row(connection: AsyncConnection, query: sa.Select[Any]) -> dict[str, Any] | None:
    """The first row of ``query`` as a dict (None: no row)."""
    row = (await connection.execute(query)).first()
    return None if row is None else dict(row._mapping)
