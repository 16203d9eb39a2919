"""``hub server``'s composition: database, MQTT link, ingest, rollout controller, REST API.

Replicas: any number of these processes may share one PostgreSQL database (each with its own
``--client-id``). Each serves the REST API, the dashboard and the ingest; the rollout
controller acts only in the one holding the controller's lease (``leadership``), and the
change counter that long polls follow is the database's (``changes.SharedChanges``).

Start order: reach the samples store (a bucket: HEAD, so a wrong name or key fails the start),
migrate the database, start the HTTP listener (the API answers ``synced: false``
until the retained reports are read), the ingest writer, the MQTT link and the controller.
``stop`` ends it (the CLI sets it on SIGTERM/SIGINT); SIGKILL is fine too — every decision is
already in the database and the MQTT session is persistent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import Callable

from aiohttp import web

from edgeagent.aio import cancel_and_wait
from edgeagent.hub.publish import clear_release_of
from edgeagent.hub.server import fleetdb
from edgeagent.hub.server.api import HubContext, create_app
from edgeagent.hub.server.auth import hub_tokens
from edgeagent.hub.server.changes import Changes, SharedChanges
from edgeagent.hub.server.controller import RolloutController
from edgeagent.hub.server.database import open_engine, upgrade
from edgeagent.hub.server.ingest import Ingest
from edgeagent.hub.server.leadership import Leadership
from edgeagent.hub.server.link import HubLink
from edgeagent.hub.server.settings import ServerSettings
from edgeagent.hub.server.upload_gate import open_trust
from edgeagent.hub.sign import ManifestSigner
from edgeagent.tls import ServerTls

log = logging.getLogger(__name__)


async def _prune_forever(ingest: Ingest, settings: ServerSettings) -> None:
    """The history's retention: delete events older than ``retention_days``, periodically.

    A sweep the database refuses (SQLite busy past its time-out, PostgreSQL restarting) is
    logged and tried again at the next interval: a background job that raised stops the whole
    server (``serve``), and old events a little longer on disk are no reason for that."""
    while True:
        cutoff = time.time() - settings.retention_days * 86400
        try:
            async with ingest.engine.begin() as connection:
                deleted = await fleetdb.prune_events(connection, cutoff)
        except Exception as exc:  # SQLAlchemy wraps every driver's errors differently
            log.warning(
                "retention sweep failed (%s); next try in %g s", exc, settings.prune_interval_s
            )
            deleted = 0
        if deleted:
            log.info(
                "retention: deleted %d event(s) older than %g days",
                deleted,
                settings.retention_days,
            )
        await asyncio.sleep(settings.prune_interval_s)


async def serve(
    settings: ServerSettings,
    *,
    client_id: str = "edgeagent-hub-server",
    ready: Callable[[str], None] = lambda url: None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the hub server until ``stop`` is set (or cancellation); ``ready(url)`` once it
    listens."""
    settings.validate()
    blobs = settings.samples.blobs(settings.state_dir)
    await asyncio.to_thread(blobs.check)  # a wrong bucket or key fails here, not per upload
    signer = ManifestSigner(settings.release_keys) if settings.release_keys else None
    open_trust(settings.trust_file, signer.keys if signer is not None else ())
    if settings.trust_file is None:
        log.warning("no --trust: uploads are relayed unverified (devices verify them)")
    tokens = hub_tokens(settings)
    engine = open_engine(settings.database_url, idle_in_transaction_s=settings.lease_s)
    await upgrade(engine)
    shared = SharedChanges(engine) if engine.dialect.name == "postgresql" else None
    changes: Changes = shared or Changes()
    if shared is not None:
        await shared.read()
    controller: RolloutController | None = None

    async def stored(answered: bool) -> None:
        if answered and controller is not None:
            controller.wake()
        await changes.bump()

    ingest = Ingest(
        engine,
        settings.mqtt.topic_prefix,
        max_report_bytes=settings.max_report_bytes,
        queue_size=settings.ingest_queue,
        batch_size=settings.ingest_batch,
        on_batch=stored,
    )
    link = HubLink(settings.mqtt, ingest, client_id=client_id)
    leadership = Leadership(
        engine, client_id, lease_s=settings.lease_s, renew_s=settings.lease_renew_s
    )
    controller = RolloutController(
        engine,
        link.publish,
        settings.mqtt.topic_prefix,
        changes,
        send_batch=settings.send_batch,
        sign=signer,
        sign_cancel=signer.cancellation if signer is not None else None,
        clear_slot=functools.partial(clear_release_of, settings.mqtt),
        leadership=leadership,
    )
    link.on_connect = controller.wake
    if shared is not None:  # another replica's API or ingest changed something: look again
        shared.on_moved = controller.wake
    context = HubContext(
        engine, settings, ingest, changes, controller.wake, settings.trust_file, leadership
    )
    tls = ServerTls(settings.tls) if settings.tls_mode != "off" and settings.tls.enabled else None
    runner = web.AppRunner(create_app(context, tokens, blobs), access_log=None)
    await runner.setup()
    site = web.TCPSite(
        runner, settings.host, settings.port, ssl_context=tls.context if tls else None
    )
    await site.start()
    if tls is not None:  # a renewed certificate: new handshakes get it, nothing restarts
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, tls.reload)
    port = runner.addresses[0][1] if runner.addresses else settings.port
    url = f"{'https' if tls else 'http'}://{settings.host}:{port}"
    log.info("hub server on %s, database %s", url, engine.url.render_as_string())
    tasks = [
        asyncio.create_task(job, name=name)
        for name, job in (
            ("ingest", ingest.run()),
            ("mqtt", link.run()),
            ("controller", controller.run(ready=ingest.synced)),
            ("retention", _prune_forever(ingest, settings)),
            ("leadership", leadership.run()),
        )
    ]
    if shared is not None:
        tasks.append(asyncio.create_task(shared.follow(), name="changes"))
    stop = stop or asyncio.Event()
    ready(url)
    try:
        done, _ = await asyncio.wait(
            [asyncio.create_task(stop.wait()), *tasks], return_when=asyncio.FIRST_COMPLETED
        )
        for task in done:  # a background job that ended on its own is a bug: say so
            if task in tasks and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        if tls is not None:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await cancel_and_wait(tasks, settings.mqtt.connect_timeout_s + 5.0)
        await runner.cleanup()
        await engine.dispose()
