"""``hub status``: the fleet table from the devices' retained MQTT reports."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.hub.common import broker_arguments, emit, mqtt_settings, run


def add_status(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "status",
        formatter_class=DefaultsFormatter,
        help="fleet table: online, models and versions, last update outcome per device",
        description="Read every device's retained state and availability from the broker "
        "(for --wait seconds) and print one line per device; --json for scripts.",
    )
    parser.add_argument("--group", help="only this group's devices")
    parser.add_argument("--wait", type=float, default=1.0, help="seconds to collect reports")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--recipients",
        type=Path,
        metavar="FILE",
        help="also write each reporting device's public key to FILE, for 'hub sign --encrypt'",
    )
    broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.encrypt import write_recipients
        from edgeagent.hub.status import collect_fleet, format_table

        rows = await collect_fleet(mqtt_settings(args), group=args.group, wait_s=args.wait)
        if args.recipients is not None:
            write_recipients(args.recipients, {r["device_id"]: r["public_key"] for r in rows})
        emit(args, rows, format_table(rows))
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))
