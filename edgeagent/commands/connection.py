"""The connection options of every command that talks to a running agent (--socket, --url …)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from edgeagent.api.client import AgentClient
from edgeagent.api.settings import ServerSettings
from edgeagent.config import load_config
from edgeagent.sections import ConfigError


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """--socket / --url / --token / --config / --timeout, as every agent-facing command has."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--socket", type=Path, help="the agent's Unix socket (default: [server] unix_socket)"
    )
    where.add_argument("--url", help="the agent's TCP address instead, e.g. http://127.0.0.1:8080")
    parser.add_argument(
        "--token",
        default=os.environ.get("EDGEAGENT_TOKEN"),
        help="bearer token for a TCP listener (default: $EDGEAGENT_TOKEN, else [server] "
        "admin_token or token when the config is readable); the Unix socket needs none",
    )
    parser.add_argument(
        "--config", type=Path, help="agent config to find the socket in (default: system file)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")


SYSTEM_SOCKET = Path("/run/edgeagent/agent.sock")


def _existing_socket(configured: Path | None) -> Path | None:
    """The configured socket, or the systemd service's when only that one exists.

    An operator's shell has no RUNTIME_DIRECTORY, so the default path it computes is the
    per-user one even when the agent runs as the system service.
    """
    if configured is not None and not configured.exists() and SYSTEM_SOCKET.exists():
        return SYSTEM_SOCKET
    return configured


def client_from_args(args: argparse.Namespace) -> AgentClient:
    """The client the connection arguments describe; ConfigError when the config is bad."""
    if args.socket is not None:  # needs no token, so no config: its token file may be root's
        return AgentClient(socket_path=args.socket, timeout=args.timeout)
    server = _readable_server_settings(args.config) if args.url else load_config(args.config).server
    if args.url:
        token = args.token or (server.admin_token or server.token if server else "")
        return AgentClient(url=args.url, token=token or None, timeout=args.timeout)
    assert server is not None
    socket_path = _existing_socket(server.unix_socket)
    if socket_path is None:
        raise ConfigError("[server] unix_socket is not set: give --socket or --url")
    return AgentClient(socket_path=socket_path, timeout=args.timeout)


def _readable_server_settings(path: Path | None) -> ServerSettings | None:
    """The config's [server] keys for the token, or None when the config cannot be read.

    Over TCP the config only supplies a token (an operator's shell often may not read the
    system file, and --url works without one); a config that exists but is invalid still
    stops the command with its message.
    """
    try:
        return load_config(path).server
    except ConfigError as exc:
        if isinstance(exc.__cause__, OSError):
            return None
        raise
