"""Which hub server runs the rollout controller: the controller asks, the database decides.

Several ``hub server`` processes may share one PostgreSQL database (replicas); every one serves
the REST API, the dashboard and the ingest, but only one at a time drives deployments. The
``leases`` row named ``controller`` says which: its holder, its expiry (the database's clock,
so the replicas' clocks do not matter) and a **fencing token** that grows by one each time
another replica takes the lease over.

- ``claim`` renews the lease of the replica that holds it, or hands it, with the next token,
  to a replica that asks once it has expired (its holder died, hung, or was paused);
- ``fence`` is the first statement of every transaction the controller writes in
  (``deploydb``'s moves, the sender's batches): it reads the token ``FOR SHARE`` and refuses
  (``NotLeader``) when it is no longer the caller's. The share lock holds until that
  transaction ends, so a takeover (an UPDATE of the row) waits for it: no write of an old
  leader commits after a newer leader exists.
- ``Leadership`` renews every ``renew_s`` and knows, by its own monotonic clock, until when its
  lease surely holds (``lease_s`` from the start of the last renewal, less ``renew_s`` as a
  margin). A process paused past that (SIGSTOP, a VM frozen) finds it lapsed when it wakes
  and stops before it publishes anything (``check``), before its renewal even runs.

The remaining window, for publishing: a message handed to the MQTT client just before the
process froze goes out when it thaws. The sender checks ``check`` and ``fence`` right before
each publish and marks the device sent in that same transaction, so this is at most the one
message in flight per frozen leader, and its device is one the new leader would send it to
anyway (the same bytes, refused by the device as ``same_version``).

On SQLite (one process) the lease is taken once at start and never expires: leadership is
local, and the fence still refuses a second process started on the same file by mistake.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from edgeagent.hub.server.schema import leases

log = logging.getLogger(__name__)

CONTROLLER = "controller"  # the lease's name
LOCAL_LEASE_S = 1e12  # SQLite's: held until another process on the file takes it by force
LOCK_WAIT_MS = 1000  # a claim waits at most this for a paused leader's share lock, then retries


class NotLeader(RuntimeError):
    """This replica does not (or no longer) hold the controller's lease: it must not write."""


def _now(connection: AsyncConnection) -> sa.ColumnElement[float]:
    """The database's clock in Unix seconds (the lease's expiry is compared with it)."""
    if connection.dialect.name == "postgresql":
        return sa.cast(sa.func.extract("epoch", sa.func.clock_timestamp()), sa.Float)
    return sa.literal(time.time(), sa.Float)  # SQLite: one process, its own clock


async def fence(connection: AsyncConnection, token: int) -> None:
    """Refuse this transaction (``NotLeader``) unless ``token`` is still the controller's
    lease token; holds a share lock on the lease until the transaction ends."""
    current = await connection.scalar(
        sa.select(leases.c.token).where(leases.c.name == CONTROLLER).with_for_update(read=True)
    )
    if current != token:
        raise NotLeader(f"fencing token {token} is stale: the lease is at {current}")


async def claim(
    connection: AsyncConnection,
    holder: str,
    token: int | None,
    lease_s: float,
    *,
    force: bool = False,
) -> int | None:
    """Renew ``holder``'s lease (it holds ``token``) or take it over when it expired (or
    ``force``: SQLite's one process, restarted); returns the token now held, or None while
    another replica's lease runs."""
    if connection.dialect.name == "postgresql":
        await connection.execute(sa.text(f"SET LOCAL lock_timeout = {LOCK_WAIT_MS}"))
    now = _now(connection)
    row = (
        await connection.execute(
            sa.select(leases.c.holder, leases.c.token, leases.c.expires_at, now.label("now"))
            .where(leases.c.name == CONTROLLER)
            .with_for_update()
        )
    ).first()
    if row is None:  # a database made from the tables, not the migrations
        await connection.execute(leases.insert().values(name=CONTROLLER))
        return await claim(connection, holder, token, lease_s, force=force)
    if row.holder == holder and row.token == token:
        held = token
    elif force or row.expires_at < row.now:
        held = row.token + 1
    else:
        return None
    await connection.execute(
        leases.update()
        .where(leases.c.name == CONTROLLER)
        .values(holder=holder, token=held, expires_at=now + lease_s)
    )
    return held


async def release(connection: AsyncConnection, holder: str, token: int) -> None:
    """Let the lease go at once (a graceful stop): another replica takes it on its next try."""
    await connection.execute(
        leases.update()
        .where(leases.c.name == CONTROLLER, leases.c.holder == holder, leases.c.token == token)
        .values(expires_at=0.0)
    )


async def current_holder(connection: AsyncConnection) -> tuple[str, int]:
    """Who holds the controller's lease and its token (``("", 0)``: nobody ever did)."""
    row = (
        await connection.execute(
            sa.select(leases.c.holder, leases.c.token).where(leases.c.name == CONTROLLER)
        )
    ).first()
    return (row.holder, row.token) if row is not None else ("", 0)


class Leadership:
    """This replica's view of the lease: ``run`` keeps claiming it; ``check`` says whether the
    controller may act now and with which token. ``on_gained`` is called when it takes over."""

    def __init__(
        self,
        engine: AsyncEngine,
        name: str,
        *,
        lease_s: float,
        renew_s: float,
        on_gained: Callable[[], None] = lambda: None,
    ) -> None:
        self.engine = engine
        self.holder = f"{name}/{secrets.token_hex(4)}"  # a restarted process is a new holder
        self.local = engine.dialect.name == "sqlite"
        self.lease_s = float("inf") if self.local else lease_s
        self.renew_s = renew_s
        self.on_gained = on_gained
        self.token: int | None = None
        self._valid_until = 0.0  # time.monotonic(): the lease surely holds before this

    def check(self) -> int:
        """The token to write with; ``NotLeader`` when this replica does not hold the lease or
        cannot be sure it still does (it was paused past its lease)."""
        if self.token is None or time.monotonic() >= self._valid_until:
            raise NotLeader(f"{self.holder} does not hold the controller's lease")
        return self.token

    def leading(self) -> bool:
        try:
            self.check()
        except NotLeader:
            return False
        return True

    async def claim_once(self) -> bool:
        """One claim (renewal or takeover); whether this replica leads afterwards."""
        started = time.monotonic()
        try:
            async with self.engine.begin() as connection:
                token = await claim(
                    connection,
                    self.holder,
                    self.token,
                    LOCAL_LEASE_S if self.local else self.lease_s,
                    force=self.local and self.token is None,
                )
        except Exception as exc:  # the database away or a paused leader's lock: try again
            log.warning("could not renew or claim the controller's lease: %s", exc)
            return self.leading()
        previous, self.token = self.token, token
        if token is None:
            if previous is not None:
                log.warning("%s lost the controller's lease", self.holder)
            return False
        self._valid_until = started + self.lease_s - (0.0 if self.local else self.renew_s)
        if token != previous:
            log.info("%s leads the rollout controller (fencing token %d)", self.holder, token)
            self.on_gained()
        return True

    async def run(self) -> None:
        """Claim, then renew every ``renew_s``, until cancelled; let the lease go on the way
        out, so a graceful stop hands the controller over at once."""
        try:
            while True:
                await self.claim_once()
                if self.local and self.token is not None:
                    await asyncio.Event().wait()  # SQLite: held for the process's life
                await asyncio.sleep(self.renew_s)
        finally:
            if self.token is not None and not self.local:
                token, self.token = self.token, None
                try:
                    async with self.engine.begin() as connection:
                        await asyncio.wait_for(release(connection, self.holder, token), 5.0)
                    log.info("%s let the controller's lease go", self.holder)
                except Exception as exc:  # it expires by itself
                    log.warning("could not let the controller's lease go: %s", exc)
