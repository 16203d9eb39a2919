"""What the ``edgeagent hub`` sub-commands share: exit codes, running a command body, output,
the broker options and the release targets / serials options.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from edgeagent.fleet.manifest import Targets
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.signing import TrustError
from edgeagent.fleet.windows import MaintenanceWindow, WindowError
from edgeagent.hub.keys import HubError

EXIT_FAILED = 1
EXIT_USAGE = 2


def run(args: argparse.Namespace, work) -> int:
    """Run one command body; the hub's and the trust code's errors are input errors (exit 2)."""
    try:
        result = work(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except (HubError, TrustError) as exc:
        print(f"edgeagent hub {args.hub_command}: {exc}", file=sys.stderr)
        return EXIT_USAGE  # what the operator gave cannot be used: keys, files, broker


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if getattr(args, "json", False) else text)


def broker_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker")
    group.add_argument(
        "--broker", default="127.0.0.1:1883", metavar="HOST:PORT", help="the fleet's MQTT broker"
    )
    group.add_argument(
        "--prefix", default="edgeagent", help="topic prefix (the devices' [mqtt] topic_prefix)"
    )
    group.add_argument("--username", default="", help="broker user name (empty: anonymous)")
    group.add_argument(
        "--password-file", type=Path, help="file holding the broker password (not on argv)"
    )
    group.add_argument("--ca", type=Path, help="CA certificate of the broker: enables TLS")
    group.add_argument("--cert", type=Path, help="client certificate for mutual TLS")
    group.add_argument("--key", dest="cert_key", type=Path, help="client certificate's key")


def mqtt_settings(args: argparse.Namespace) -> MqttSettings:
    host, _, port = args.broker.rpartition(":")
    if not host or not port.isdigit():
        raise HubError(f"--broker {args.broker!r}: expected HOST:PORT")
    password = ""
    if args.password_file is not None:
        try:
            password = args.password_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise HubError(f"--password-file {args.password_file}: {exc.strerror}") from exc
    settings = MqttSettings(
        host=host.strip("[]"),
        port=int(port),
        topic_prefix=args.prefix,
        username=args.username,
        password=password,
        tls=args.ca is not None,
        ca_file=args.ca,
        cert_file=args.cert,
        key_file=args.cert_key,
    )
    try:
        settings.validate()
    except ValueError as exc:
        raise HubError(str(exc).replace("[mqtt] ", "--")) from exc
    return settings


def serials_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--serials",
        type=Path,
        help="the per-model release serial counters (default: serials.json beside the key)",
    )


def release_targets(args: argparse.Namespace) -> Targets:
    """The devices a signed release is for, from --profile/--device-class/--device-id."""
    return Targets(
        profiles=tuple(args.profile),
        device_classes=tuple(args.device_class),
        device_ids=tuple(args.device_id),
    )


def release_serials(args: argparse.Namespace):
    from edgeagent.hub.serials import ReleaseSerials

    return None if args.serials is None else ReleaseSerials(args.serials)


def window_arguments(parser: argparse.ArgumentParser, stages: bool = False) -> None:
    """``--window SCHEDULE`` / ``--window-timezone TZ`` (and per stage ``--stage-window``):
    when devices may take the release, in their local time (fleet.windows)."""
    parser.add_argument(
        "--window",
        metavar="SCHEDULE",
        help="maintenance window, e.g. 'Mon-Fri 02:00-04:00' (entries separated by ';'); a "
        "release arriving outside it waits for it (docs/fleet/windows-and-locks.md)",
    )
    parser.add_argument(
        "--window-timezone",
        metavar="TZ",
        help="IANA zone of the window(s), e.g. Europe/Berlin (default: each device's own)",
    )
    if stages:
        parser.add_argument(
            "--stage-window",
            action="append",
            default=[],
            metavar="N=SCHEDULE",
            help="maintenance window of stage N (1-based) only; repeat per stage",
        )


def release_window(
    schedule: str | None, zone: str | None, flag: str = "--window"
) -> MaintenanceWindow | None:
    """The ``MaintenanceWindow`` the flags describe (None without a schedule)."""
    if schedule is None:
        if zone is not None:
            raise HubError(f"--window-timezone needs {flag}")
        return None
    try:
        return MaintenanceWindow(schedule, zone)
    except WindowError as exc:
        raise HubError(f"{flag} {schedule!r}: {exc}") from exc


def stage_windows(args: argparse.Namespace) -> dict[int, MaintenanceWindow]:
    """``--stage-window N=SCHEDULE`` flags as {stage number: MaintenanceWindow}."""
    windows = {}
    for entry in args.stage_window:
        number, sep, schedule = entry.partition("=")
        if not sep or not number.isdigit() or int(number) < 1:
            raise HubError(f"--stage-window {entry!r}: must be N=SCHEDULE, N from 1")
        window = release_window(schedule, args.window_timezone, "--stage-window")
        assert window is not None
        windows[int(number)] = window
    return windows
