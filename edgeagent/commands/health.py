"""``edgeagent health``: exit 0 when the running agent is ready, 1 when not, with one line why.

Made for probes that read only an exit status: the container image's ``HEALTHCHECK``, a systemd
timer or ``ExecStartPost=``, a monitoring agent. It asks ``GET /v2/health/ready`` over the Unix
socket, found as ``edgeagent status`` finds it, because the socket needs no token: under the
default config every TCP request without one is 401, so a TCP probe could never pass. Every
failure is exit 1, bad config included: Docker reserves exit 2 of a health check.
"""

from __future__ import annotations

import argparse
import sys

from edgeagent.api.client import AgentError, AgentUnreachable
from edgeagent.commands.connection import add_connection_arguments, client_from_args
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.sections import ConfigError

EXIT_READY = 0
EXIT_NOT_READY = 1
# A probe's own deadline is short (Docker's default is 30 s, the image's 5 s); the agent
# answers readiness from memory, so a slow answer is itself a sign of trouble.
DEFAULT_TIMEOUT_S = 3.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "health",
        formatter_class=DefaultsFormatter,
        help="exit 0 when the running agent is ready to serve, 1 otherwise (for health checks)",
        description=(
            "Ask the running agent whether it is ready (GET /v2/health/ready: at least one "
            "model takes traffic) and exit 0 if so, 1 if not, printing one line why. Connects "
            "to the Unix socket of the agent's config (no token needed) unless --socket or "
            "--url says otherwise. For Docker's HEALTHCHECK, systemd and monitoring alike."
        ),
    )
    add_connection_arguments(parser)
    parser.set_defaults(handler=run, timeout=DEFAULT_TIMEOUT_S)


def run(args: argparse.Namespace) -> int:
    try:
        client = client_from_args(args)
    except (ConfigError, ValueError) as exc:
        print(f"edgeagent health: {exc}", file=sys.stderr)
        return EXIT_NOT_READY
    try:
        client.request("GET", "/v2/health/ready")
    except AgentUnreachable as exc:
        print(f"edgeagent health: not ready: {exc}", file=sys.stderr)
        return EXIT_NOT_READY
    except AgentError as exc:
        why = "no model is ready to serve yet" if exc.status == 400 else str(exc)
        print(f"edgeagent health: not ready: {client.where}: {why}", file=sys.stderr)
        return EXIT_NOT_READY
    print(f"ready: {client.where}")
    return EXIT_READY
