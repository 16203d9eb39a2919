"""``edgeagent status``: what a running agent is doing, asked over its socket or TCP."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from edgeagent.api.client import AgentError
from edgeagent.commands.connection import add_connection_arguments, client_from_args
from edgeagent.sections import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show a running agent's profile, accelerators, governor, models and updates",
        description=(
            "Ask the running agent for its status (GET /v1/status): the detected profile and "
            "chosen accelerators with any fallbacks, the governor's state and actions, every "
            "model with its versions and backend, and the update state. Connects to the Unix "
            "socket of the agent's config unless --socket or --url says otherwise. Exit status "
            "1 when the agent cannot be reached or answers with an error."
        ),
    )
    add_connection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the status as one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        client = client_from_args(args)
    except (ConfigError, ValueError) as exc:
        print(f"edgeagent status: {exc}", file=sys.stderr)
        return 2
    try:
        status = client.status()
    except AgentError as exc:
        print(f"edgeagent status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    print(f"edgeagent at {client.where}")
    print(yaml.safe_dump(status, sort_keys=False, default_flow_style=False).rstrip())
    return 0
