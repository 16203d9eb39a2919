"""The agent's configuration: ``/etc/edgeagent/agent.toml`` composed of one section per part.

Every key has a default, so the agent runs with no file at all (the embedded default of
SPEC §2); a bad key or value stops start-up with a message naming ``[section] key``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

from edgeagent._toml import tomllib
from edgeagent.api.grpc.settings import GrpcSettings
from edgeagent.api.settings import ServerSettings
from edgeagent.api.shm.settings import SharedMemorySettings
from edgeagent.api.zmq.settings import ZmqSettings
from edgeagent.capture.settings import CaptureSettings
from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.engine.settings import EngineSettings
from edgeagent.fleet.settings import MqttSettings
from edgeagent.governor.settings import GovernorSettings
from edgeagent.hardware.discovery import DiscoverySettings
from edgeagent.hardware.peers import PeerSettings, peers_problem
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.locate import find_packages
from edgeagent.models.package import PackageError
from edgeagent.netaddr import is_loopback
from edgeagent.paths import default_models_dir, default_state_dir
from edgeagent.sections import (
    ConfigError,
    KeyDoc,
    collecting,
    computed_setting,
    describe_section,
    did_you_mean,
    load_section,
    require,
    setting,
    unknown_keys,
)
from edgeagent.streams.settings import StreamSettings, StreamsSettings, streams_problem
from edgeagent.tls import TlsSettings, plain_listener_problem
from edgeagent.updates.settings import UpdateSettings

DEFAULT_CONFIG_PATH = Path("/etc/edgeagent/agent.toml")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSettings:
    """[agent]: where the agent keeps its state and finds its seed model packages."""

    state_dir: Path = computed_setting(
        default_state_dir,
        "model store, probe cache, trust store: $STATE_DIRECTORY under systemd, else "
        "$XDG_STATE_HOME/edgeagent (~/.local/state/edgeagent)",
    )
    models_dir: Path | None = setting(
        None,
        "seed model packages; unset = $EDGEAGENT_MODELS_DIR, else ./zoo, else <state_dir>/models",
    )
    models: list[str] = computed_setting(list, "package names to serve; empty = every package")
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR")
    device_id: str = setting("", "this device's id towards the hub; empty = the host name")

    def validate(self) -> None:
        levels = ("DEBUG", "INFO", "WARNING", "ERROR")
        require(self.log_level in levels, "agent", "log_level", f"must be one of {levels}")


@dataclass(frozen=True)
class Config:
    agent: AgentSettings = field(default_factory=AgentSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    hardware: HardwareSettings = field(default_factory=HardwareSettings)
    governor: GovernorSettings = field(default_factory=GovernorSettings)
    updates: UpdateSettings = field(default_factory=UpdateSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    grpc: GrpcSettings = field(default_factory=GrpcSettings)
    shared_memory: SharedMemorySettings = field(default_factory=SharedMemorySettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    llm: LanguageSettings = field(default_factory=LanguageSettings)
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    zmq: ZmqSettings = field(default_factory=ZmqSettings)
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    streams: StreamsSettings = field(default_factory=StreamsSettings)
    peers: tuple[PeerSettings, ...] = ()  # the [[peer]] tables, in file order
    cameras: tuple[StreamSettings, ...] = ()  # the [[stream]] tables, in file order

    def __post_init__(self) -> None:
        # The one rule across sections: gRPC's TCP listener takes [server]'s token rule, so
        # "none" (open user scope) is as loopback-only there as on HTTP.
        require(
            not self.grpc.enabled
            or self.grpc.port == 0
            or self.server.tcp_auth == "token"
            or is_loopback(self.grpc.host),
            "grpc",
            "host",
            f"[server] tcp_auth = 'none' is only allowed on loopback, not {self.grpc.host!r}",
        )
        # Every TCP listener shares [tls]; none serves plain off loopback unless told to.
        for section, host, mode, listening in (
            ("server", self.server.tcp_host, self.server.tls, self.server.tcp_port != 0),
            ("grpc", self.grpc.host, self.grpc.tls, self.grpc.enabled and self.grpc.port != 0),
        ):
            problem = plain_listener_problem(host, mode, self.tls) if listening else None
            require(problem is None, section, "tls", problem or "")
        require(not peers_problem(self.peers), "peer", "name", peers_problem(self.peers))
        require(
            not self.discovery.announce or self.server.tcp_port != 0,
            "discovery",
            "announce",
            "announces the TCP listener: set [server] tcp_port",
        )
        problem = streams_problem(self.cameras)
        require(problem is None, "stream", "name", problem or "")


# TOML table → the Config fields it fills. [server] is shared by the listener (api) and the
# engine, each owning its keys; a key neither knows is refused naming both sets.
SECTIONS: dict[str, dict[str, type]] = {
    "agent": {"agent": AgentSettings},
    "server": {"server": ServerSettings, "engine": EngineSettings},
    "hardware": {"hardware": HardwareSettings},
    "governor": {"governor": GovernorSettings},
    "updates": {"updates": UpdateSettings},
    "mqtt": {"mqtt": MqttSettings},
    "grpc": {"grpc": GrpcSettings},
    "shared_memory": {"shared_memory": SharedMemorySettings},
    "tls": {"tls": TlsSettings},
    "llm": {"llm": LanguageSettings},
    "capture": {"capture": CaptureSettings},
    "zmq": {"zmq": ZmqSettings},
    "discovery": {"discovery": DiscoverySettings},
    "streams": {"streams": StreamsSettings},
}
# Arrays of tables ([[peer]]): TOML name → (the Config field, the class of each table).
TABLE_ARRAYS: dict[str, tuple[str, type]] = {
    "peer": ("peers", PeerSettings),
    "stream": ("cameras", StreamSettings),
}


def _load_array(name: str, value: object, problems: list[str]) -> dict[str, object]:
    """The Config field an array of tables fills: one settings object per table."""
    attr, cls = TABLE_ARRAYS[name]
    if value is None:
        return {attr: ()}
    if not isinstance(value, list):
        problems.append(f"[[{name}]] must be an array of tables ([[{name}]] headers)")
        return {attr: ()}
    return {attr: tuple(load_section(cls, table, name) for table in value)}


def _load_table(section: str, table: object, problems: list[str]) -> dict[str, object]:
    """The Config fields that one TOML table fills, each from the keys its class declares."""
    owners = SECTIONS[section]
    if len(owners) == 1 or not isinstance(table, dict):
        return {attr: load_section(cls, table, section) for attr, cls in owners.items()}
    known = {attr: {f.name for f in fields(cls)} for attr, cls in owners.items()}
    every = set().union(*known.values())
    unknown = set(table) - every
    if unknown:
        problems.append(unknown_keys(section, unknown, every))
    return {
        attr: load_section(cls, {k: v for k, v in table.items() if k in known[attr]}, section)
        for attr, cls in owners.items()
    }


def parse_config(text: str, source: str = "<config>") -> Config:
    """Validate TOML text into a Config.

    Every problem is found, not only the first: ConfigError.problems lists each, prefixed with
    the source and naming the section and key.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    values: dict[str, object] = {}
    with collecting() as problems:
        known = [*SECTIONS, *TABLE_ARRAYS]
        unknown = sorted(set(data) - set(known))
        if unknown:
            problems.append(
                f"unknown section(s) {', '.join(unknown)}{did_you_mean(unknown, known)}; "
                f"known: {', '.join(known)}"
            )
        for section in SECTIONS:
            values.update(_load_table(section, data.get(section), problems))
        for name in TABLE_ARRAYS:
            values.update(_load_array(name, data.get(name), problems))
        if not problems:
            config = Config(**values)  # type: ignore[arg-type]
    if problems:
        raise ConfigError(*(f"{source}: {problem}" for problem in problems))
    return config


def config_file(path: Path | None) -> Path | None:
    """The file ``load_config(path)`` reads: ``path``, else the system file if it exists
    (None: the embedded defaults). The daemon checks this file for exposed secrets."""
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        return DEFAULT_CONFIG_PATH
    return path


def load_config(path: Path | None) -> Config:
    """Read ``path``; with None, the system file if it exists, else the embedded defaults."""
    path = config_file(path)
    if path is None:
        return parse_config("", "<embedded default>")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from exc
    return parse_config(text, str(path))


def describe_config() -> dict[str, list[KeyDoc]]:
    """Every TOML table with every key it accepts, as ``config show`` and the README list them
    (an array of tables, ``[[peer]]``, under its name like the others)."""
    described = {
        section: [doc for cls in owners.values() for doc in describe_section(cls)]
        for section, owners in SECTIONS.items()
    }
    for name, (_, cls) in TABLE_ARRAYS.items():
        described[name] = describe_section(cls)
    return described


def package_dirs(config: Config) -> list[Path]:
    """The seed packages to serve: every package in the models directory, or those named.

    ``[agent] models_dir`` when set, else the default (``$EDGEAGENT_MODELS_DIR``, ./zoo, the
    state directory's models/), so a fresh checkout serves the demo zoo with no config.
    """
    directory = config.agent.models_dir or default_models_dir()
    try:
        found = find_packages(directory)  # an unreadable package is listed, not fatal
    except PackageError as exc:
        if config.agent.models_dir is not None:  # named by the operator: a typo, not a fresh box
            raise ConfigError(f"[agent] models_dir: {exc}") from exc
        found = {}
    if not config.agent.models:
        if not found:
            log.warning("no model packages in %s: serving nothing until one is loaded", directory)
        return list(found.values())
    missing = [name for name in config.agent.models if name not in found]
    if missing:
        raise ConfigError(
            f"[agent] models: no package {', '.join(map(repr, missing))} in {directory} "
            f"(found: {', '.join(found) or 'none'})"
        )
    return [found[name] for name in config.agent.models]
