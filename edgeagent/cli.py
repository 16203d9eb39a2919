"""The ``edgeagent`` command: one sub-command module per area, each with ``register()``.

A sub-command's module is imported only when that sub-command runs (or its own ``--help`` is
asked for): ``edgeagent --help`` lists every command from the table below without importing
any of them, so it stays fast and a missing optional runtime cannot break unrelated commands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from edgeagent import __version__, logs
from edgeagent.commands.helpfmt import SuggestingParser

# name -> (module, the one-line help ``edgeagent --help`` shows). Each module defines
# register(subparsers), which adds the parser ``name`` (with this same help: a test keeps the
# two equal) and sets ``handler`` via set_defaults(handler=fn), fn(args) -> exit status.
COMMANDS: dict[str, tuple[str, str]] = {
    "infer": (
        "edgeagent.commands.infer",
        "classify JPEG/PNG images with a model, or find objects with a detector",
    ),
    "bench": (
        "edgeagent.commands.bench",
        "benchmark every runtime × precision of a model that works here",
    ),
    "run": (
        "edgeagent.commands.run",
        "run the agent daemon (serves models over HTTP on a Unix socket and TCP)",
    ),
    "status": (
        "edgeagent.commands.status",
        "summarise a running agent: board, models and backends, governor, updates",
    ),
    "health": (
        "edgeagent.commands.health",
        "exit 0 when the running agent is ready to serve, 1 otherwise (for health checks)",
    ),
    "profile": (
        "edgeagent.commands.profile",
        "show the detected board, every accelerator candidate and the choice per model",
    ),
    "config": (
        "edgeagent.commands.config",
        "check a config file, or show every key with its value, unit and meaning",
    ),
    "package": (
        "edgeagent.commands.package",
        "turn ONNX / TFLite / OpenVINO / PyTorch / GGUF models into a validated package",
    ),
    "capture": (
        "edgeagent.commands.capture",
        "captured samples on this device: status, audit log, purge",
    ),
    "agent-update": (
        "edgeagent.commands.selfupdate",
        "the A/B root of agent self-updates: init, boot check, status",
    ),
    "hub": (
        "edgeagent.commands.hub",
        "fleet manager: keys, signing, publishing, artifact server, rollouts, fleet status",
    ),
}


def chosen_command(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv``, if any: the top-level options take no values, so
    it is the first argument that is not an option."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser, with the full parser of the sub-command ``argv`` names and a one-line stub
    for every other one (enough for ``--help`` and for argparse's choice of command)."""
    parser = SuggestingParser(  # its sub-parsers are of its class: every error suggests
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
    chosen = chosen_command(argv)
    for name, (module, summary) in COMMANDS.items():
        if name == chosen:
            importlib.import_module(module).register(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def log_format() -> str:
    """The journal stamps each line itself (JOURNAL_STREAM is set there); a terminal needs it."""
    plain = "%(levelname)s %(name)s: %(message)s"
    return plain if os.environ.get("JOURNAL_STREAM") else "%(asctime)s " + plain


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(arguments)
    args = parser.parse_args(arguments)
    logs.configure(logging.DEBUG if args.verbose else logging.WARNING, log_format())
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
