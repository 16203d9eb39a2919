"""``edgeagent health``: exit 0 when the running agent is ready, 1 when not, with one line why.

Made for probes that read only an exit status: the container image's ``HEALTHCHECK``, a systemd
timer or ``ExecStartPost=``, a monitoring agent. It asks ``GET /v2/health/ready`` over the Unix
socket, found as ``edgeagent status`` finds it, because the socket needs no token: under the
default config every TCP request without one is 401, so a TCP probe could never pass. Every
failure is exit 1, bad config included: Docker reserves exit 2 of a health check.

``--model`` asks about one model (``GET /v2/models/{name}/ready``) and ``--wait`` keeps asking
until the answer is yes or the wait is over: ``systemctl reload`` returns once the signal is
sent, before the new package is loaded and its plan chosen, so a script that reloads and then
sends a request needs a way to wait for exactly that model rather than a guessed sleep.
"""

from __future__ import annotations

import argparse
import sys
import time
from urllib.parse import quote

from edgeagent.api.client import AgentClient, AgentError, AgentUnreachable
from edgeagent.commands.connection import add_connection_arguments, client_from_args
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.sections import ConfigError

EXIT_READY = 0
EXIT_NOT_READY = 1
# A probe's own deadline is short (Docker's default is 30 s, the image's 5 s); the agent
# answers readiness from memory, so a slow answer is itself a sign of trouble.
DEFAULT_TIMEOUT_S = 3.0
# How often --wait asks again: loading a package takes hundreds of milliseconds to seconds,
# so a few questions a second wait no longer than needed and cost the agent nothing.
RETRY_INTERVAL_S = 0.25


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
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="ask whether this model is ready (GET /v2/models/NAME/ready), not the whole agent",
    )
    parser.add_argument(
        "--wait",
        metavar="SECONDS",
        type=_seconds,
        default=0.0,
        help="keep asking until ready or SECONDS have passed (after a reload, say); 0 asks once",
    )
    add_connection_arguments(parser)
    parser.set_defaults(handler=run, timeout=DEFAULT_TIMEOUT_S)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"--wait takes 0 to 86400 seconds, not {text}")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        client = client_from_args(args)
    except (ConfigError, ValueError) as exc:
        print(f"edgeagent health: {exc}", file=sys.stderr)
        return EXIT_NOT_READY
    path = (
        "/v2/health/ready" if not args.model else f"/v2/models/{quote(args.model, safe='')}/ready"
    )
    subject = "" if not args.model else f"model {args.model} at "
    deadline = time.monotonic() + args.wait
    while True:
        why = _not_ready(client, path, args.model)
        if why is None:
            print(f"ready: {subject}{client.where}")
            return EXIT_READY
        if time.monotonic() + RETRY_INTERVAL_S > deadline:
            waited = f" after waiting {args.wait:g} s" if args.wait else ""
            print(f"edgeagent health: not ready{waited}: {why}", file=sys.stderr)
            return EXIT_NOT_READY
        time.sleep(RETRY_INTERVAL_S)


def _not_ready(client: AgentClient, path: str, model: str | None) -> str | None:
    """None when ``path`` answers ready, else one line saying why not."""
    try:
        client.request("GET", path)
    except AgentUnreachable as exc:
        return str(exc)
    except AgentError as exc:
        if model is None and exc.status == 400:
            return f"{client.where}: no model is ready to serve yet"
        if model is not None and exc.status in (400, 404, 503):  # loading, or not (yet) known
            return f"{client.where}: model {model} is not ready to serve yet"
        return f"{client.where}: {exc}"
    return None
