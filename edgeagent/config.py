"""The agent's configuration: ``/etc/edgeagent/agent.toml`` composed of one section per part.

Every key has a default, so the agent runs with no file at all (the embedded default of
SPEC §2); a bad key or value stops start-up with a message naming ``[section] key``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from edgeagent._toml import tomllib
from edgeagent.governor.settings import GovernorSettings
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.serving.settings import ServerSettings
from edgeagent.settings import ConfigError, load_section, require
from edgeagent.updates.settings import MqttSettings, UpdateSettings

DEFAULT_CONFIG_PATH = Path("/etc/edgeagent/agent.toml")


def default_state_dir() -> Path:
    """systemd's StateDirectory when run as a service, else the user's XDG state directory."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "edgeagent"


@dataclass(frozen=True)
class AgentSettings:
    """[agent]: where the agent keeps its state and finds its seed model packages."""

    state_dir: Path = field(default_factory=default_state_dir)
    # Seed packages; default: $EDGEAGENT_MODELS_DIR, else ./zoo, else <state_dir>/models.
    models_dir: Path | None = None
    models: list[str] = field(default_factory=list)  # names to serve; empty = every package
    log_level: str = "INFO"
    device_id: str = ""  # default: the host name

    def validate(self) -> None:
        levels = ("DEBUG", "INFO", "WARNING", "ERROR")
        require(self.log_level in levels, "agent", "log_level", f"must be one of {levels}")


@dataclass(frozen=True)
class Config:
    agent: AgentSettings = field(default_factory=AgentSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    hardware: HardwareSettings = field(default_factory=HardwareSettings)
    governor: GovernorSettings = field(default_factory=GovernorSettings)
    updates: UpdateSettings = field(default_factory=UpdateSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)


SECTIONS = {
    "agent": AgentSettings,
    "server": ServerSettings,
    "hardware": HardwareSettings,
    "governor": GovernorSettings,
    "updates": UpdateSettings,
    "mqtt": MqttSettings,
}


def parse_config(text: str, source: str = "<config>") -> Config:
    """Validate TOML text into a Config; ConfigError names the source, section and key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}"
        )
    try:
        sections: dict[str, object] = {
            name: load_section(cls, data.get(name), name) for name, cls in SECTIONS.items()
        }
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    return Config(**sections)  # type: ignore[arg-type]


def load_config(path: Path | None) -> Config:
    """Read ``path``; with None, the system file if it exists, else the embedded defaults."""
    if path is None:
        if not DEFAULT_CONFIG_PATH.is_file():
            return parse_config("", "<embedded default>")
        path = DEFAULT_CONFIG_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from exc
    return parse_config(text, str(path))
