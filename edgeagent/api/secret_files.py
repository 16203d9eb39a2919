"""Files that hold the agent's secrets: reading a token from one, and saying who else can read it.

A token exists to keep local users out of the API, so a token any local user can read protects
nothing. The tokens may live outside ``agent.toml`` (``[server] token_file``, or a systemd
credential that ``LoadCredential=`` hands to the service in ``$CREDENTIALS_DIRECTORY``), and
``edgeagent config check`` and the daemon at start name every secret file that others can
read, with the command that fixes it. A warning, not a refusal: the fix is one command, and an
agent that refused to start would take a device's models away over a file mode.
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from edgeagent.fleet.settings import MqttSettings
from edgeagent.models.device_key import DEVICE_KEY_FILE
from edgeagent.sections import require

# The systemd credential names the agent looks for (LoadCredential=NAME:/path in the unit).
TOKEN_CREDENTIAL = "edgeagent-token"
ADMIN_TOKEN_CREDENTIAL = "edgeagent-admin-token"

# The group the installer and the image give the agent; secrets may be readable by it.
AGENT_GROUP = "edgeagent"


def credential(name: str) -> Path | None:
    """``$CREDENTIALS_DIRECTORY/name`` when systemd passed that credential, else None."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    return path if path.is_file() else None


def read_secret(path: Path, section: str, key: str) -> str | None:
    """The secret in ``path``, surrounding whitespace (a trailing newline) stripped.

    A missing, unreadable or empty file is a problem of ``[section] key`` (raised, or recorded
    inside ``sections.collecting()``; then None is returned).
    """
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        require(False, section, key, f"{path} does not exist")
        return None
    except OSError as exc:
        require(False, section, key, f"cannot read {path}: {exc.strerror}")
        return None
    except UnicodeDecodeError:
        require(False, section, key, f"{path} is not UTF-8 text")
        return None
    require(bool(secret), section, key, f"{path} is empty")
    return secret or None


def agent_group() -> int:
    """The group the agent runs as: ``edgeagent`` where it exists, else this process's."""
    try:
        return grp.getgrnam(AGENT_GROUP).gr_gid
    except KeyError:
        return os.getegid()


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def exposure(path: Path, group: int) -> str | None:
    """One line naming ``path`` and the fix when users other than its owner and ``group`` can
    read it; None when they cannot (or it does not exist: reading it reports that)."""
    try:
        info = path.stat()
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o004:
        return (
            f"{path} holds a secret and every local user can read it (mode {mode:04o}): "
            f"run chmod o-rwx {path}"
        )
    if mode & 0o040 and info.st_gid != group:
        return (
            f"{path} holds a secret and group {_group_name(info.st_gid)} can read it "
            f"(mode {mode:04o}): run chgrp {_group_name(group)} {path} or chmod g-rwx {path}"
        )
    return None


def exposures(paths: Iterable[Path], group: int) -> list[str]:
    """The ``exposure`` line of every path others can read, each path once."""
    found = (exposure(path, group) for path in dict.fromkeys(paths))
    return [line for line in found if line is not None]


class TokenSources(Protocol):
    """Where [server]'s tokens came from (``ServerSettings``; a protocol to avoid an import
    cycle, since the settings read their token files with this module)."""

    @property
    def token(self) -> str: ...
    @property
    def admin_token(self) -> str: ...
    @property
    def token_file(self) -> Path | None: ...
    @property
    def admin_token_file(self) -> Path | None: ...


def secret_files(
    config_file: Path | None, server: TokenSources, mqtt: MqttSettings, state_dir: Path
) -> list[Path]:
    """Every file the agent reads a secret from.

    The config file counts when it holds a secret itself: a [server] token or admin_token
    written in it (not read from a token file), or an [mqtt] password. Then the token files,
    the MQTT client key and the device's own key.
    """
    inline = (server.token and not server.token_file) or (
        server.admin_token and not server.admin_token_file
    )
    files = [config_file] if config_file is not None and (inline or mqtt.password) else []
    sources = (server.token_file, server.admin_token_file, mqtt.key_file)
    return [*files, *(path for path in sources if path is not None), state_dir / DEVICE_KEY_FILE]
