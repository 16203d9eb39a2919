"""Device profiles (SPEC §4): one TOML per board family, validated into frozen dataclasses.

A profile is data, not code, so that supporting a new board is a reviewed text file. Every
field is checked on load and an error names the file and the key, because a typo in a profile
would otherwise surface much later as "the accelerator was never used".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from edgeagent._toml import tomllib
from edgeagent.models.package import PRECISIONS, RUNTIMES
from edgeagent.paths import shipped_profiles_dir
from edgeagent.sections import did_you_mean

ARCHES = ("aarch64", "x86_64", "any")
POWER_CLASSES = ("high", "low")
THERMAL_SENSORS = ("zone", "hwmon", "apex")
POWER_SENSOR_KINDS = ("ina3221", "hwmon", "rapl", "vcgencmd_pmic")
MATCH_KINDS = ("files", "compatible", "model", "cpu_flags", "devices")
# Prefixes a [match] devices entry may use instead of a path below the root.
DEVICE_PREFIXES = ("usb:", "pci:", "driver:")


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Match:
    """Evidence that identifies the board: every non-empty kind must hold, any element of one.

    ``devices`` entries are a path below the root (``dev/apex_0``), ``usb:VID:PID``,
    ``pci:VID:DID`` or ``driver:CLASS:NAME`` (``/sys/class/CLASS/*/device/driver`` → NAME), so
    that one list can say "a Coral on PCIe or on USB".
    """

    files: tuple[str, ...] = ()
    compatible: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    cpu_flags: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()

    def kinds(self) -> dict[str, tuple[str, ...]]:
        """The kinds this profile actually uses, in the order they are checked."""
        return {kind: getattr(self, kind) for kind in MATCH_KINDS if getattr(self, kind)}


@dataclass(frozen=True)
class Candidate:
    """One (runtime, device, precision) the board may run, in the profile's ranking order."""

    runtime: str
    device: str
    precision: str
    power: str = "high"
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.runtime}:{self.device}:{self.precision}"


@dataclass(frozen=True)
class ThermalLimit:
    sensor: str  # zone | hwmon | apex
    name: str  # zone type, hwmon name or apex device (never an index: numbering changes)
    label: str
    warm_c: float
    hot_c: float
    critical_c: float


@dataclass(frozen=True)
class PowerSensor:
    kind: str
    name: str
    total: bool = False


@dataclass(frozen=True)
class BatterySpec:
    supply: str
    ac: str = "AC"
    low_percent: float = 20.0


@dataclass(frozen=True)
class Accessory:
    """Hardware the board may carry that the agent recognises but cannot drive itself.

    Reported by ``edgeagent profile`` (e.g. a Hailo-8L on a Raspberry Pi 5 needs HailoRT, for
    which there is no runtime plugin) so an operator knows why it sits idle.
    """

    name: str
    devices: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    arch: str
    generic: bool
    priority: int
    match: Match
    threads: int | None
    candidates: tuple[Candidate, ...]
    thermal: tuple[ThermalLimit, ...]
    power_budget_w: float | None
    power_sensors: tuple[PowerSensor, ...]
    throttle_command: str | None
    battery: BatterySpec | None
    source: Path
    accessories: tuple[Accessory, ...] = ()


class _Table:
    """Typed reads from one TOML table, failing with ``file: key: problem``."""

    def __init__(self, source: Path, where: str, value: Any) -> None:
        self.source = source
        self.where = where
        if not isinstance(value, dict):
            self.error("", f"must be a table, got {type(value).__name__}")
        self.data: dict[str, Any] = value

    def error(self, key: str, problem: str) -> NoReturn:
        name = ".".join(p for p in (self.where, key) if p) or "(top level)"
        raise ProfileError(f"{self.source}: {name}: {problem}")

    def only(self, *allowed: str) -> None:
        extra = sorted(set(self.data) - set(allowed))
        if extra:
            hint = did_you_mean(extra[:1], allowed)
            self.error(extra[0], f"unknown key{hint} (allowed: {', '.join(allowed)})")

    def string(self, key: str, default: str | None = None, choices: tuple[str, ...] = ()) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            self.error(key, "missing" if value is None else f"must be a string, got {value!r}")
        if choices and value not in choices:
            self.error(key, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def number(self, key: str, default: float | None = None) -> float | None:
        value = self.data.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            self.error(key, f"must be a number, got {value!r}")
        return None if value is None else float(value)

    def integer(self, key: str, default: int) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(key, f"must be an integer, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self.error(key, f"must be true or false, got {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.error(key, f"must be a list of non-empty strings, got {value!r}")
        return tuple(value)

    def table(self, key: str) -> _Table:
        return _Table(
            self.source, ".".join(p for p in (self.where, key) if p), self.data.get(key, {})
        )

    def tables(self, key: str) -> list[_Table]:
        value = self.data.get(key, [])
        if not isinstance(value, list):
            self.error(key, "must be an array of tables ([[...]])")
        prefix = ".".join(p for p in (self.where, key) if p)
        return [_Table(self.source, f"{prefix}[{i}]", item) for i, item in enumerate(value)]


def load_profile(path: Path) -> Profile:
    """Read and validate one profile file; ProfileError names the file and key at fault."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc}") from exc
    top = _Table(path, "", data)
    top.only(
        "name", "description", "arch", "generic", "priority", "match", "threads", "candidate",
        "thermal", "power", "throttle", "battery", "accessory",
    )  # fmt: skip
    name = top.string("name")
    if name != path.stem:
        top.error("name", f"{name!r} must equal the file name {path.stem!r}")
    generic = top.flag("generic", False)
    match = _match(top.table("match"))
    if not generic and not match.kinds():
        top.error("match", "a non-generic profile needs at least one kind of evidence")
    threads_table = top.table("threads")
    threads_table.only("intra_op")
    threads = threads_table.data.get("intra_op")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)):
        threads_table.error("intra_op", f"must be an integer, got {threads!r}")
    if threads is not None and threads < 1:
        threads_table.error("intra_op", "must be at least 1")
    candidates = tuple(_candidate(t) for t in top.tables("candidate"))
    if not candidates:
        top.error("candidate", "at least one [[candidate]] is required")
    keys = [c.key for c in candidates]
    for key in keys:
        if keys.count(key) > 1:
            top.error("candidate", f"{key} is listed twice")
    thermal = top.table("thermal")
    thermal.only("zone")
    power = top.table("power")
    power.only("budget_w", "sensor")
    budget = power.number("budget_w")
    if budget is not None and budget <= 0:
        power.error("budget_w", "must be positive")
    throttle = top.table("throttle")
    throttle.only("command")
    return Profile(
        name=name,
        description=top.string("description", ""),
        arch=top.string("arch", None, ARCHES),
        generic=generic,
        priority=top.integer("priority", 0),
        match=match,
        threads=threads,
        candidates=candidates,
        thermal=tuple(_thermal(t) for t in thermal.tables("zone")),
        power_budget_w=budget,
        power_sensors=tuple(_power_sensor(t) for t in power.tables("sensor")),
        throttle_command=throttle.string("command", "") or None,
        battery=_battery(top.table("battery")) if "battery" in top.data else None,
        source=path,
        accessories=tuple(_accessory(t) for t in top.tables("accessory")),
    )


def load_profiles(directory: Path | None = None) -> list[Profile]:
    """Every ``*.toml`` in ``directory`` (default: the shipped profiles), sorted by name."""
    directory = Path(directory) if directory is not None else shipped_profiles_dir()
    if not directory.is_dir():
        raise ProfileError(f"{directory}: profile directory does not exist")
    profiles = [load_profile(path) for path in sorted(directory.glob("*.toml"))]
    if not profiles:
        raise ProfileError(f"{directory}: no *.toml profiles found")
    return profiles


def board_profiles(extra_dir: Path | None = None) -> list[Profile]:
    """The shipped profiles plus ``extra_dir``'s (``[hardware] profiles_dir``), sorted by name.

    A profile in ``extra_dir`` replaces the shipped one of the same name, so an operator can
    tune one board's candidates without copying the other nine.
    """
    merged = {p.name: p for p in load_profiles()}
    if extra_dir is not None:
        merged.update((p.name, p) for p in load_profiles(extra_dir))
    return [merged[name] for name in sorted(merged)]


def _devices(table: _Table, key: str) -> tuple[str, ...]:
    entries = table.strings(key)
    for entry in entries:
        if entry.startswith("/"):
            table.error(key, f"{entry!r} must be relative to the root (no leading '/')")
        prefix = next((p for p in DEVICE_PREFIXES if entry.startswith(p)), None)
        if prefix and len(entry[len(prefix) :].split(":")) != 2:
            table.error(key, f"{entry!r} must be {prefix}A:B")
    return entries


def _match(table: _Table) -> Match:
    table.only(*MATCH_KINDS)
    for relative in table.strings("files"):
        if relative.startswith("/"):
            table.error("files", f"{relative!r} must be relative to the root (no leading '/')")
    return Match(
        files=table.strings("files"),
        compatible=table.strings("compatible"),
        model=table.strings("model"),
        cpu_flags=table.strings("cpu_flags"),
        devices=_devices(table, "devices"),
    )


def _candidate(table: _Table) -> Candidate:
    table.only("runtime", "device", "precision", "power", "options")
    options = table.data.get("options", {})
    if not isinstance(options, dict):
        table.error("options", "must be an inline table")
    device = table.string("device")
    if not device.strip():
        table.error("device", "must not be empty")
    return Candidate(
        runtime=table.string("runtime", None, RUNTIMES),
        device=device,
        precision=table.string("precision", None, PRECISIONS),
        power=table.string("power", "high", POWER_CLASSES),
        options=dict(options),
    )


def _thermal(table: _Table) -> ThermalLimit:
    table.only("sensor", "name", "label", "warm_c", "hot_c", "critical_c")
    warm, hot, critical = (table.number(k) for k in ("warm_c", "hot_c", "critical_c"))
    for key, value in (("warm_c", warm), ("hot_c", hot), ("critical_c", critical)):
        if value is None:
            table.error(key, "missing")
    assert warm is not None and hot is not None and critical is not None
    if not warm < hot < critical:
        table.error("hot_c", f"limits must rise: warm {warm} < hot {hot} < critical {critical}")
    return ThermalLimit(
        sensor=table.string("sensor", None, THERMAL_SENSORS),
        name=table.string("name"),
        label=table.string("label", ""),
        warm_c=warm,
        hot_c=hot,
        critical_c=critical,
    )


def _power_sensor(table: _Table) -> PowerSensor:
    table.only("kind", "name", "total")
    return PowerSensor(
        kind=table.string("kind", None, POWER_SENSOR_KINDS),
        name=table.string("name"),
        total=table.flag("total", False),
    )


def _battery(table: _Table) -> BatterySpec:
    table.only("supply", "ac", "low_percent")
    low = table.number("low_percent", 20.0)
    assert low is not None
    if not 0 <= low <= 100:
        table.error("low_percent", "must be between 0 and 100")
    return BatterySpec(supply=table.string("supply"), ac=table.string("ac", "AC"), low_percent=low)


def _accessory(table: _Table) -> Accessory:
    table.only("name", "devices", "note")
    devices = _devices(table, "devices")
    if not devices:
        table.error("devices", "must list at least one device")
    return Accessory(name=table.string("name"), devices=devices, note=table.string("note", ""))
