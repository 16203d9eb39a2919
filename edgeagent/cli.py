"""The ``edgeagent`` command: one sub-command module per area, each with ``register()``.

Modules are imported only when their command runs, so ``edgeagent --help`` stays fast and a
missing optional runtime cannot break unrelated commands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from edgeagent import __version__

# Each module defines register(subparsers) and sets ``handler`` via set_defaults(handler=fn),
# where fn(args) -> int is the exit status.
COMMAND_MODULES = (
    "edgeagent.commands.infer",
    "edgeagent.commands.bench",
    "edgeagent.commands.run",
    "edgeagent.commands.status",
    "edgeagent.commands.profile",
    "edgeagent.commands.hub",
    "edgeagent.commands.package",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgeagent",
        description=(
            "Inference agent for edge devices: detects the board, picks the best accelerator, "
            "serves quantized models over HTTP, throttles on heat and power, and installs only "
            "signed model updates."
        ),
    )
    parser.add_argument("--version", action="version", version=f"edgeagent {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log debug detail to standard error"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
