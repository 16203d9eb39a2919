"""``edgeagent capture``: what the device has captured, and ``purge`` to delete all of it.

Works on the state directory of the agent's config, running agent or not: the spool is plain
files, one per sample, and each deletion is written to the audit log as the agent's are.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgeagent.capture.audit import AuditLog
from edgeagent.capture.service import SPOOL_DIR, capture_dir, purge
from edgeagent.capture.spool import Spool
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.config import DEFAULT_CONFIG_PATH, load_config
from edgeagent.sections import ConfigError

SUMMARY = "captured samples on this device: status, audit log, purge"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "capture",
        formatter_class=DefaultsFormatter,
        help=SUMMARY,
        description=(
            "Show the samples the agent captured ([capture]: sealed with the device key in "
            "<state_dir>/capture/spool) and the audit log of what was captured, uploaded and "
            "deleted, or delete every sample now (purge)."
        ),
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help=f"agent config (default: {DEFAULT_CONFIG_PATH})"
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("status", help="samples on disk, their bytes and the audit log's tail")
    purge_parser = actions.add_parser("purge", help="delete every captured sample (audited)")
    purge_parser.add_argument(
        "--yes", action="store_true", help="do it (without --yes only the count is shown)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"edgeagent capture: {exc}", file=sys.stderr)
        return 2
    root = capture_dir(config.agent.state_dir)
    spool = Spool(root / SPOOL_DIR, _no_key, int(config.capture.max_disk_mib * 1024 * 1024))
    audit = AuditLog(root)
    if args.action == "purge":
        count = len(spool.ids())
        if not args.yes:
            print(f"{count} sample(s) in {spool.directory}; run again with --yes to delete them")
            return 1 if count else 0
        print(f"deleted {purge(spool, audit)} sample(s) from {spool.directory}")
        return 0
    print(
        json.dumps(
            {
                "spool": str(spool.directory),
                "samples": len(spool.ids()),
                "bytes": spool.used_bytes(),
                "audit": audit.entries()[-20:],
            },
            indent=2,
        )
    )
    return 0


def _no_key() -> bytes:
    raise RuntimeError("the capture command never opens a sample")
