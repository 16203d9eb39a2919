"""The connection options of every command that talks to a running agent (--socket, --url …)."""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import stat
from pathlib import Path
from urllib.parse import urlsplit

from edgeagent.api.client import AgentClient
from edgeagent.api.settings import ServerSettings
from edgeagent.commands.peer import listener_uids
from edgeagent.config import load_config
from edgeagent.netaddr import is_loopback
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
        help="bearer token for a TCP listener (default: $EDGEAGENT_TOKEN, else [server] token "
        "when the config is readable; never the admin token, which only load/unload needs); "
        "the Unix socket needs none",
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
    """The client the connection arguments describe; ConfigError when the config is bad.

    Over TCP the config's token is the user token, never ``admin_token``: every command here
    (status, metrics, health, infer) needs only the user scope. On a loopback address it goes
    only to a listener owned by root, this user or the agent's user (``check_tcp_peer``); on
    another address nothing proves who listens, and the user token is the least a token can
    give away. The Unix socket is checked (``check_socket``) and needs no token at all.
    """
    if args.socket is not None:  # needs no token, so no config: its token file may be root's
        check_socket(args.socket)
        return AgentClient(socket_path=args.socket, timeout=args.timeout)
    server = _readable_server_settings(args.config) if args.url else load_config(args.config).server
    if args.url:
        token = args.token  # --token or $EDGEAGENT_TOKEN: the operator chose it and the peer
        if not token and server is not None and server.token:
            check_tcp_peer(args.url)
            token = server.token
        return AgentClient(url=args.url, token=token or None, timeout=args.timeout)
    assert server is not None
    return AgentClient(socket_path=socket_of(args.config, server), timeout=args.timeout)


def socket_of(config: Path | None, server: ServerSettings | None = None) -> Path:
    """The Unix socket a command asks when no --socket or --url is given, checked.

    The config's ``[server] unix_socket`` (its default follows $RUNTIME_DIRECTORY, then
    $XDG_RUNTIME_DIR, then /tmp), or the system service's when only that one exists.
    """
    if server is None:
        server = load_config(config).server
    socket_path = _existing_socket(server.unix_socket)
    if socket_path is None:
        raise ConfigError("[server] unix_socket is not set: give --socket or --url")
    check_socket(socket_path)
    return socket_path


AGENT_USER = "edgeagent"  # the system service's user (systemd/edgeagent.sysusers)


def check_tcp_peer(url: str) -> None:
    """Refuse to send the config's token to a loopback port that another user holds.

    With the agent stopped or restarting, any local user may bind its port and collect the
    token of the next ``edgeagent status --url``. The kernel names each listening socket's
    owner (``edgeagent.commands.peer``): root (a container's port forwarder too), this user
    and the agent's user are trusted; anyone else is refused with ConfigError. Non-loopback
    addresses and systems without the kernel's tables cannot be checked, and pass.
    """
    parsed = urlsplit(url)
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        return  # the client names a malformed URL itself
    if not is_loopback(parsed.hostname or ""):
        return
    owners = listener_uids(port)
    if owners is None:
        return
    trusted = _trusted_uids()
    with contextlib.suppress(KeyError):  # no such user: a development install
        trusted.add(pwd.getpwnam(AGENT_USER).pw_uid)
    strangers = sorted(owners - trusted)
    if strangers:
        raise ConfigError(
            f"{url}: port {port} is held by uid {', '.join(map(str, strangers))}, not by root, "
            f"you or the user {AGENT_USER}: refusing to send it [server] token (is the agent "
            "running? if this is it, give --token)"
        )


def check_socket(path: Path) -> None:
    """Refuse a socket that someone other than this user, root or the agent could have put there.

    The daemon refuses to listen in a directory another user owns (``/tmp/edgeagent-UID`` can
    be created by anyone before it starts), and the client applies the same rule before it
    connects, or it would print the squatter's answers as the agent's. The agent itself may be
    another user (the system service's ``/run/edgeagent``): a directory that user owns is
    trusted when its parent only root or we can write, since nobody else could have made it.
    A directory others may write is refused unless it is sticky (/tmp itself), where the socket
    must then be ours or root's. ConfigError says what is wrong; a missing path is left to the
    connection, which names it.
    """
    path = path.absolute()
    directory = path.parent
    try:
        info = directory.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{directory} is not a plain directory; remove it or give --socket")
    if info.st_uid not in _trusted_uids() and not _only_trusted_write(directory.parent):
        raise ConfigError(
            f"{directory} belongs to uid {info.st_uid}, and other users may write its parent "
            f"{directory.parent}: anyone could have made it and could answer in the agent's "
            "place; remove it or give --socket"
        )
    if info.st_mode & 0o022:
        if not info.st_mode & stat.S_ISVTX:
            raise ConfigError(
                f"{directory} is writable by other users, who could replace the agent's socket; "
                "fix its mode or give --socket"
            )
        try:
            owner = path.lstat().st_uid
        except FileNotFoundError:
            return
        if owner not in _trusted_uids():
            raise ConfigError(
                f"{path} belongs to uid {owner} in {directory}, which every user may write: "
                "anyone could have made it; remove it or give --socket"
            )


def _trusted_uids() -> set[int]:
    return {os.geteuid(), 0}


def _only_trusted_write(directory: Path) -> bool:
    """True when only root or this user can create entries in ``directory``."""
    try:
        info = directory.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode) and info.st_uid in _trusted_uids() and not info.st_mode & 0o022
    )


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
