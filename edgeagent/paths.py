"""Where the agent keeps things by default: state, runtime socket, models, shipped data.

Every default follows systemd's directories when run as a service (StateDirectory,
RuntimeDirectory) and the XDG directories otherwise, so the same code serves a packaged board
and a developer's checkout.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def default_state_dir() -> Path:
    """systemd's StateDirectory when run as a service, else the user's XDG state directory."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "edgeagent"


def default_socket_path() -> Path:
    """/run/edgeagent under systemd (RuntimeDirectory), else the user's runtime directory.

    Without either, ``/tmp/edgeagent-$UID/agent.sock``.
    """
    runtime = os.environ.get("RUNTIME_DIRECTORY") or os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime.split(":")[0]) / (
            "agent.sock" if "RUNTIME_DIRECTORY" in os.environ else "edgeagent/agent.sock"
        )
    return Path("/tmp") / f"edgeagent-{os.getuid()}" / "agent.sock"


def default_models_dir() -> Path:
    """EDGEAGENT_MODELS_DIR, else ./zoo (what scripts/setup.sh builds), else the state dir's."""
    if os.environ.get("EDGEAGENT_MODELS_DIR"):
        return Path(os.environ["EDGEAGENT_MODELS_DIR"])
    if Path("zoo").is_dir():
        return Path("zoo").resolve()
    return default_state_dir() / "models"


def shipped(name: str) -> Path:
    """A file or directory shipped inside the ``edgeagent`` package (the wheel's package data).

    ``name`` is relative to the package: ``device_profiles``, ``systemd/edgeagent.service``,
    ``agent.example.toml``, ``api/http/openapi.yaml``. Wheels install unzipped, so the resource is
    a real path that ``glob`` and ``open`` can use.
    """
    return Path(str(resources.files("edgeagent").joinpath(name)))


def shipped_profiles_dir() -> Path:
    """The device profiles shipped with the agent; ``[hardware] profiles_dir`` adds to them."""
    return shipped("device_profiles")
