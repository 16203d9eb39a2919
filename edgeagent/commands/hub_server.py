"""``edgeagent hub server`` and the ``--server`` mode of ``hub status`` / ``hub rollout``.

Kept apart from ``commands/hub/`` (which only calls ``register``): the server's flags, and a
wrapper that sends ``status`` and ``rollout`` to a running server when ``--server URL`` or
``$EDGEAGENT_HUB_SERVER`` is given, leaving their stand-alone behaviour untouched otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent.commands.extras import missing_extra
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.hub.keys import HubError

if TYPE_CHECKING:  # imported when used: every CLI start would pay for aiohttp's client
    from edgeagent.hub.server.client import HubApiClient

SERVER_ENV = "EDGEAGENT_HUB_SERVER"
TOKEN_ENV = "EDGEAGENT_HUB_TOKEN"

Run = Callable[[argparse.Namespace, Callable[[argparse.Namespace], Any]], int]
Emit = Callable[[argparse.Namespace, Any, str], None]


def register(
    commands: argparse._SubParsersAction,
    *,
    broker_arguments: Callable[[argparse.ArgumentParser], None],
    mqtt_settings: Callable[[argparse.Namespace], Any],
    run: Run,
    emit: Emit,
) -> None:
    """Add ``hub server`` and give ``status``/``rollout`` their ``--server`` option."""
    _server(commands, broker_arguments, mqtt_settings, run)
    _client_mode(commands.choices["status"], _status_work, run, emit)
    _client_mode(commands.choices["rollout"], _rollout_work, run, emit)


def _server(
    commands: argparse._SubParsersAction,
    broker_arguments: Callable[[argparse.ArgumentParser], None],
    mqtt_settings: Callable[[argparse.Namespace], Any],
    run: Run,
) -> None:
    from edgeagent.commands.hub.samples import add_store_arguments, store_settings
    from edgeagent.hub.server.samples_settings import SamplesSettings
    from edgeagent.hub.server.settings import ServerSettings

    defaults = ServerSettings(database_url="")
    parser = commands.add_parser(
        "server",
        help="the fleet manager as a service: database, REST API, durable rollouts",
        description="Store every device's reports and an event history in a database "
        "(SQLite under --state-dir by default, or --db postgresql://USER@HOST/DB), keep "
        "deployments as rows and drive them (a restart resumes them), and answer the REST API "
        "at http://HOST:PORT/api/v1 (document: /openapi.json). Tokens: --token-file with "
        "'read TOKEN' / 'admin TOKEN' lines, required unless --host is loopback; without it "
        "an admin token is made in STATE_DIR/admin.token on the first start (or --open).",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "--db",
        default=None,
        help="sqlite:///PATH or postgresql://USER@HOST/DB (default: hub.db under --state-dir)",
    )
    parser.add_argument(
        "--state-dir", type=Path, help="where the SQLite file and the generated admin.token live"
    )
    parser.add_argument("--host", default=defaults.host, help="REST API and dashboard address")
    parser.add_argument("--port", type=int, default=defaults.port, help="0 picks a free port")
    parser.add_argument("--token-file", type=Path, help="'SCOPE TOKEN' lines (read / admin)")
    parser.add_argument(
        "--open",
        action="store_true",
        help="no tokens at all (loopback only): anyone who can reach the port, any local user "
        "included, may upload, sign and deploy releases to the whole fleet",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name clients use besides the listen address and loopback (a LAN name, a "
        "reverse proxy's); others are refused as DNS rebinding (repeat for more)",
    )
    parser.add_argument(
        "--trust",
        type=Path,
        help="the trust file devices have: every upload must verify against it (signature, "
        "trust, manifest, dates, a serial above the model's) before it is stored, signed or "
        "sent; required with --release-key",
    )
    parser.add_argument(
        "--release-key",
        type=Path,
        action="append",
        default=[],
        help="the hub's release key (repeat for a threshold): the server signs each stage "
        "batch's envelope itself, targeted at that batch's devices; without it the uploaded "
        "envelope is sent unchanged (keep the keys beside the server's state, e.g. "
        "STATE_DIR/keys/release.key)",
    )
    parser.add_argument("--client-id", default="edgeagent-hub-server", help="MQTT session id")
    tls = parser.add_argument_group("TLS (HTTPS; the files are re-read on SIGHUP)")
    tls.add_argument("--tls-cert", type=Path, help="PEM certificate chain, leaf first")
    tls.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    tls.add_argument(
        "--tls-client-ca",
        type=Path,
        help="PEM CA: clients must also present a certificate it signs (mTLS, beside tokens)",
    )
    tls.add_argument(
        "--tls",
        choices=("auto", "off"),
        default="auto",
        help="off: plain HTTP even off loopback (a TLS-terminating proxy in front); auto: "
        "HTTPS with --tls-cert, plain HTTP on loopback only",
    )
    samples = parser.add_argument_group("samples captured on devices (see Learning from the field)")
    samples.add_argument(
        "--device-tokens", type=Path, help="'DEVICE_ID GROUP TOKEN' lines: who may upload samples"
    )
    samples.add_argument(
        "--samples-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="a device group allowed to upload samples (repeat; '*' = every group)",
    )
    add_store_arguments(samples)
    samples.add_argument(
        "--max-sample-bytes",
        type=int,
        default=defaults.samples.max_sample_bytes,
        help="a bigger upload is refused unread",
    )
    limits = parser.add_argument_group("limits")
    for flag, attr, kind, what in (
        ("--retention-days", "retention_days", float, "event history kept"),
        ("--prune-interval", "prune_interval_s", float, "seconds between retention sweeps"),
        ("--max-report-bytes", "max_report_bytes", int, "bigger device messages are skipped"),
        ("--max-body-bytes", "max_body_bytes", int, "largest REST request body"),
        ("--page-size", "page_size", int, "default page of /devices"),
        ("--max-page-size", "max_page_size", int, "largest page a client may ask for"),
        ("--max-wait", "max_wait_s", float, "cap on stage time-outs and long polls, seconds"),
        ("--ingest-queue", "ingest_queue", int, "reports waiting for the database"),
        ("--ingest-batch", "ingest_batch", int, "reports stored per transaction"),
        ("--send-batch", "send_batch", int, "devices one recorded envelope is for"),
        ("--lease", "lease_s", float, "controller lease of replicas on one database, seconds"),
        ("--lease-renew", "lease_renew_s", float, "seconds between the leader's renewals"),
        ("--max-stages", "max_stages", int, "stages of one deployment"),
        ("--max-device-ids", "max_device_ids", int, "devices a deployment may list by id"),
        ("--chart-points", "chart_points", int, "state reports a device page's charts draw"),
    ):
        default = getattr(defaults, attr)
        limits.add_argument(flag, dest=attr, type=kind, default=default, help=what)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.server.settings import default_database_url
        from edgeagent.tls import TlsSettings

        database_url = args.db or default_database_url(args.state_dir)
        missing = missing_extra("hub", *_database_modules(database_url))
        if missing is not None:  # before anything is opened: a pip command, not a traceback
            raise HubError(missing)
        store = store_settings(args)  # likewise for boto3 with --samples-store
        from edgeagent.hub.blobs import BlobError
        from edgeagent.hub.server.service import serve

        try:  # a service logs what it does (the sync count, every stage); the CLI's default
            logging.getLogger().setLevel(args.log_level.upper())  # is warnings only
        except ValueError as exc:
            raise HubError(f"--log-level: {exc}") from exc
        settings = ServerSettings(
            database_url=database_url,
            host=args.host,
            port=args.port,
            mqtt=mqtt_settings(args),
            token_file=args.token_file,
            retention_days=args.retention_days,
            prune_interval_s=args.prune_interval_s,
            max_report_bytes=args.max_report_bytes,
            max_body_bytes=args.max_body_bytes,
            page_size=args.page_size,
            max_page_size=args.max_page_size,
            max_wait_s=args.max_wait_s,
            ingest_queue=args.ingest_queue,
            ingest_batch=args.ingest_batch,
            send_batch=args.send_batch,
            lease_s=args.lease_s,
            lease_renew_s=args.lease_renew_s,
            max_stages=args.max_stages,
            max_device_ids=args.max_device_ids,
            chart_points=args.chart_points,
            release_keys=tuple(args.release_key),
            trust_file=args.trust,
            state_dir=args.state_dir or defaults.state_dir,
            open=args.open,
            allowed_hosts=tuple(args.allowed_host),
            tls=TlsSettings(args.tls_cert, args.tls_key, args.tls_client_ca),
            tls_mode=args.tls,
            samples=SamplesSettings(
                device_tokens=args.device_tokens,
                groups=tuple(args.samples_group),
                directory=args.samples_dir,
                store=store,
                max_sample_bytes=args.max_sample_bytes,
            ),
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            settings.validate()
            await serve(
                settings,
                client_id=args.client_id,
                ready=lambda url: print(f"hub server listening on {url}", flush=True),
                stop=stop,
            )
        except (ValueError, BlobError) as exc:
            raise HubError(str(exc)) from exc
        except OSError as exc:
            raise HubError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from exc
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))


def _database_modules(database_url: str) -> tuple[str, ...]:
    """The ``[hub]`` extra's modules a server on ``database_url`` imports: its driver only."""
    driver = "asyncpg" if database_url.startswith("postgresql") else "aiosqlite"
    return ("sqlalchemy", "alembic", driver)


def _client_mode(
    parser: argparse.ArgumentParser,
    work: Callable[[argparse.Namespace, Emit], Any],
    run: Run,
    emit: Emit,
) -> None:
    """``--server``: the same command, answered by the hub server."""
    group = parser.add_argument_group("hub server")
    group.add_argument(
        "--server",
        default=os.environ.get(SERVER_ENV, ""),
        metavar="URL",
        help=f"ask this hub server instead of the broker (default ${SERVER_ENV})",
    )
    group.add_argument(
        "--token-file", type=Path, help=f"file holding the server's bearer token (or ${TOKEN_ENV})"
    )
    stand_alone = parser.get_default("handler")
    parser.set_defaults(
        handler=lambda args: (
            run(args, lambda a: work(a, emit)) if args.server else stand_alone(args)
        )
    )


def _client(args: argparse.Namespace) -> HubApiClient:
    from edgeagent.hub.server.client import HubApiClient

    token = os.environ.get(TOKEN_ENV, "")
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise HubError(f"--token-file {args.token_file}: {exc.strerror}") from exc
    return HubApiClient(args.server, token)


async def _status_work(args: argparse.Namespace, emit: Emit) -> int:
    from edgeagent.hub.server.client import status_row
    from edgeagent.hub.status import format_table

    async with _client(args) as client:
        devices, synced = await client.devices(args.group)
    rows = [status_row(d) for d in devices]
    text = format_table(rows)
    if not synced:
        text += "\n(the server has not finished reading the broker's retained reports yet)"
    emit(args, rows, text)
    return 0


async def _rollout_work(args: argparse.Namespace, emit: Emit) -> int:
    from edgeagent.hub.server.client import read_upload
    from edgeagent.hub.server.targets import left_out_text

    try:
        stages = [float(p) for p in args.stages.split(",")]
    except ValueError as exc:
        raise HubError(f"--stages {args.stages!r}: expected e.g. 5,25,100") from exc
    envelope = read_upload(args.release, args.trust)  # a model's or the agent's
    plan = {
        "stages_pct": stages,
        "abort_threshold_pct": args.abort_threshold,
        "min_executed": args.min_executed,
        "stage_timeout_s": args.stage_timeout,
    }
    seen: list[tuple[str, int, int]] = []

    def say(deployment: dict[str, Any]) -> None:
        totals = deployment["totals"]
        answered = totals["succeeded"] + totals["failed"] + totals["timed_out"]
        mark = (deployment["state"], deployment["stage"], answered)
        if args.json or (seen and seen[-1] == mark):
            return
        seen.append(mark)
        print(
            f"{deployment['id']}: {deployment['state']} stage {deployment['stage']}/"
            f"{deployment['stage_count']}: {totals['succeeded']} succeeded, "
            f"{totals['failed'] + totals['timed_out']} failed, {totals['sent']} waiting",
            flush=True,
        )

    async with _client(args) as client:
        deployment = await client.deploy(
            envelope, group=args.group, devices=args.device or [], plan=plan
        )
        left_out = deployment.get("left_out")
        if left_out and not args.json:  # an agent release: devices it has no wheelhouse for
            print(
                f"{left_out['devices']} device(s) left out: {left_out_text(left_out)}", flush=True
            )
        deployment = await client.follow(deployment, say)
    verdict = deployment["state"] + (f": {deployment['reason']}" if deployment["reason"] else "")
    emit(args, deployment, f"rollout {deployment['id']} {verdict}")
    if deployment["state"] != "succeeded":
        print(f"edgeagent hub rollout: {verdict}", file=sys.stderr)
        return 1
    return 0
