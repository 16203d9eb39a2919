"""Board recognition from the files a Linux board exposes, read below a configurable root.

Everything is read through ``root`` so tests run every profile against a faithful fake tree,
and every read tolerates a missing, unreadable or garbled file: such evidence is simply absent,
and the reason is kept so ``edgeagent profile`` can say why a board was not recognised.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

from edgeagent.hardware.profile import Profile, ProfileError

log = logging.getLogger(__name__)

_MACHINES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8l": "aarch64"}
_PRINTABLE = re.compile(r"^[\x20-\x7e]+$")
# CPU features that change which precision is fast; reported, not matched on by default.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "asimddp", "i8mm", "sve")


def _read_bytes(path: Path, notes: list[str], limit: int = 1 << 16) -> bytes | None:
    try:
        with path.open("rb") as handle:
            return handle.read(limit)
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.append(f"{path}: unreadable ({exc.strerror or exc})")
        return None


def _text(path: Path, notes: list[str]) -> str | None:
    """A small sysfs/procfs text file, stripped of NULs and whitespace; None when unusable."""
    raw = _read_bytes(path, notes)
    if raw is None:
        return None
    text = raw.replace(b"\0", b"").decode("utf-8", errors="replace").strip()
    if "\ufffd" in text:
        notes.append(f"{path}: not text, ignored")
        return None
    return text


@dataclass(frozen=True)
class BoardFacts:
    """What the tree says about the board; every field may be empty on an unknown board."""

    root: Path
    arch: str
    model: str = ""
    compatible: tuple[str, ...] = ()
    tegra_release: str = ""  # "R36.4.3" from /etc/nv_tegra_release
    dts_filename: str = ""  # Jetson module name (p3767 …)
    cpu_flags: frozenset[str] = frozenset()
    thermal_zones: tuple[str, ...] = ()
    hwmon: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # files that were there but unusable

    def has_device(self, entry: str) -> bool:
        """``entry`` from a profile's devices list: a path, usb:VID:PID, pci:VID:DID, driver:C:N."""
        kind, _, rest = entry.partition(":")
        if kind == "usb":
            return rest in _bus_ids(self.root / "sys/bus/usb/devices", "idVendor", "idProduct")
        if kind == "pci":
            return rest in _bus_ids(self.root / "sys/bus/pci/devices", "vendor", "device")
        if kind == "driver":
            cls, _, driver = rest.partition(":")
            return driver in _drivers(self.root / "sys/class" / cls)
        return os.path.lexists(self.root / entry)

    def summary(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "arch": self.arch,
            "model": self.model,
            "compatible": list(self.compatible),
            "tegra_release": self.tegra_release,
            "module": self.dts_filename,
            "cpu_flags": sorted(f for f in self.cpu_flags if f in SPEED_FLAGS),
            "thermal_zones": list(self.thermal_zones),
            "hwmon": list(self.hwmon),
            "notes": list(self.notes),
        }


def _bus_ids(directory: Path, vendor_file: str, product_file: str) -> set[str]:
    """``vendor:product`` of every device on a bus, lower-case hex without ``0x``."""
    ids: set[str] = set()
    notes: list[str] = []
    for device in sorted(directory.glob("*")) if directory.is_dir() else []:
        vendor = _text(device / vendor_file, notes)
        product = _text(device / product_file, notes)
        if vendor and product:
            ids.add(f"{vendor.lower().removeprefix('0x')}:{product.lower().removeprefix('0x')}")
    return ids


def _drivers(class_dir: Path) -> set[str]:
    """Driver names bound to the devices of a sysfs class (the ``device/driver`` link target)."""
    names: set[str] = set()
    for entry in sorted(class_dir.glob("*")) if class_dir.is_dir() else []:
        try:
            names.add(Path(os.readlink(entry / "device" / "driver")).name)
        except OSError:
            continue
    return names


def _names(pattern: str, root: Path, notes: list[str]) -> tuple[str, ...]:
    found = []
    for path in sorted(root.glob(pattern)):
        name = _text(path, notes)
        if name and _PRINTABLE.match(name):
            found.append(name)
    return tuple(found)


def _cpuinfo(root: Path, notes: list[str]) -> tuple[str | None, frozenset[str]]:
    """The architecture the cpuinfo format implies, and the CPU feature flags."""
    text = _text(root / "proc/cpuinfo", notes)
    if not text:
        return None, frozenset()
    arch = None
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep:
            continue
        if key == "flags" and not flags:
            arch, flags = "x86_64", frozenset(value.split())
        elif key == "Features" and not flags:
            arch, flags = "aarch64", frozenset(value.split())
        elif key == "CPU architecture" and value.strip() == "8":
            arch = "aarch64"
    return arch, flags


def _tegra_release(root: Path, notes: list[str]) -> str:
    """``# R36 (release), REVISION: 4.3, …`` → ``R36.4.3``; empty when absent or garbled."""
    text = _text(root / "etc/nv_tegra_release", notes)
    if not text:
        return ""
    match = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    if not match:
        notes.append(f"{root / 'etc/nv_tegra_release'}: no 'R<major> (release), REVISION:' line")
        return "unknown"
    return f"R{match.group(1)}.{match.group(2).rstrip('.')}"


def _emulated(
    arch: str | None, flags: frozenset[str], machine: str | None, notes: list[str]
) -> tuple[str | None, frozenset[str]]:
    """The interpreter's architecture over a cpuinfo that describes another one.

    qemu user emulation (an arm64 container on an x86_64 host through binfmt_misc) shows the
    host kernel's /proc/cpuinfo to the emulated process: x86 flags for an aarch64 interpreter.
    The wheels and runtime kernels that run are the interpreter's, so its machine wins and the
    foreign flags are dropped (they describe a CPU this process does not execute on).
    """
    if machine is None or arch is None:
        return arch, flags
    running = _MACHINES.get(machine.lower(), machine.lower())
    if running == arch:
        return arch, flags
    notes.append(
        f"proc/cpuinfo describes {arch} but this interpreter runs on {running} (emulated, e.g. "
        f"qemu-user): architecture {running}, CPU flags unknown"
    )
    return running, frozenset()


def read_facts(root: Path | str = "/", machine: str | None = None) -> BoardFacts:
    """Gather the board evidence below ``root``; never raises for a bad or missing file.

    ``machine`` is the architecture of the process that will run the models; on the live tree
    (``/``) it defaults to this interpreter's, and a cpuinfo of another architecture is taken
    for emulation (``_emulated``). A fake tree is read as it is unless a test passes one.
    """
    root = Path(root)
    notes: list[str] = []
    if machine is None and root.resolve() == Path("/"):
        machine = platform.machine()
    arch, flags = _emulated(*_cpuinfo(root, notes), machine, notes)
    if arch is None:
        machine = platform.machine().lower()
        arch = _MACHINES.get(machine, machine)
        notes.append(f"no usable proc/cpuinfo: architecture taken from this host ({arch})")
    raw_compatible = _read_bytes(root / "proc/device-tree/compatible", notes) or b""
    compatible = []
    for part in raw_compatible.split(b"\0"):
        entry = part.decode("utf-8", errors="replace").strip()
        if entry and _PRINTABLE.match(entry):
            compatible.append(entry)
        elif entry:
            notes.append(f"proc/device-tree/compatible: garbled entry {entry[:40]!r} ignored")
    model = _text(root / "proc/device-tree/model", notes) or ""
    return BoardFacts(
        root=root,
        arch=arch,
        model=model,
        compatible=tuple(compatible),
        tegra_release=_tegra_release(root, notes),
        dts_filename=_text(root / "proc/device-tree/nvidia,dtsfilename", notes) or "",
        cpu_flags=flags,
        thermal_zones=_names("sys/class/thermal/thermal_zone*/type", root, notes),
        hwmon=_names("sys/class/hwmon/hwmon*/name", root, notes),
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class MatchResult:
    """How one profile fared against the facts: matched or not, and the evidence either way."""

    profile: str
    matched: bool
    evidence: tuple[str, ...]


def match_profile(profile: Profile, facts: BoardFacts) -> MatchResult:
    """Every kind the profile lists must hold (any element of it); the arch must fit."""
    evidence: list[str] = []
    if profile.arch not in ("any", facts.arch):
        return MatchResult(profile.name, False, (f"arch {facts.arch} is not {profile.arch}",))
    if profile.generic:
        return MatchResult(profile.name, True, (f"generic fall-back for {profile.arch}",))
    ok = True
    for kind, wanted in profile.match.kinds().items():
        if kind == "files":
            hits = [w for w in wanted if (facts.root / w).is_file()]
        elif kind == "compatible":
            hits = [w for w in wanted if w in facts.compatible]
        elif kind == "model":
            hits = [w for w in wanted if w in facts.model]
        elif kind == "cpu_flags":
            hits = [w for w in wanted if w in facts.cpu_flags]
        else:
            hits = [w for w in wanted if facts.has_device(w)]
        if hits:
            evidence.append(f"{kind}: {', '.join(hits)}")
        else:
            ok = False
            evidence.append(f"{kind}: none of {', '.join(wanted)}")
    return MatchResult(profile.name, ok, tuple(evidence))


@dataclass(frozen=True)
class Detection:
    """The chosen profile, why, and how every other profile fared."""

    profile: Profile
    facts: BoardFacts
    reason: str
    results: tuple[MatchResult, ...] = field(default=())
    accessories: tuple[str, ...] = ()  # "Hailo-8L …: needs HailoRT …" for accessories present

    def thermal_presence(self) -> list[dict[str, object]]:
        """Which of the profile's thermal sensors the board really has (the governor reads them)."""
        present = []
        for limit in self.profile.thermal:
            if limit.sensor == "zone":
                found = limit.name in self.facts.thermal_zones
            elif limit.sensor == "hwmon":
                found = limit.name in self.facts.hwmon
            else:
                found = (self.facts.root / "sys/class/apex" / limit.name / "temp").is_file()
            present.append({"sensor": limit.sensor, "name": limit.name, "present": found})
        return present

    def report(self) -> dict[str, object]:
        return {
            "profile": self.profile.name,
            "description": self.profile.description,
            "reason": self.reason,
            "board": self.facts.summary(),
            "profiles": [
                {"name": r.profile, "matched": r.matched, "evidence": list(r.evidence)}
                for r in self.results
            ],
            "accessories": list(self.accessories),
            "thermal": self.thermal_presence(),
            "threads": self.profile.threads,
            "power_budget_w": self.profile.power_budget_w,
        }


def _generic(profiles: list[Profile], arch: str) -> Profile:
    generics = [p for p in profiles if p.generic]
    for profile in generics:
        if profile.arch == arch:
            return profile
    if not generics:
        raise ProfileError("no generic profile (generic = true) among the device profiles")
    return generics[0]


def detect(profiles: list[Profile], facts: BoardFacts, forced: str = "") -> Detection:
    """Pick the most specific matching profile; unknown or conflicting evidence → generic."""
    results = tuple(match_profile(p, facts) for p in profiles)
    by_name = {p.name: p for p in profiles}
    if forced:
        if forced not in by_name:
            raise ProfileError(f"[hardware] profile: no profile named {forced!r}")
        chosen, reason = by_name[forced], "forced by [hardware] profile"
    else:
        specific = sorted(
            (by_name[r.profile] for r in results if r.matched and not by_name[r.profile].generic),
            key=lambda p: -p.priority,
        )
        if not specific:
            chosen = _generic(profiles, facts.arch)
            reason = f"no specific profile matched; generic fall-back for {facts.arch}"
        elif len(specific) > 1 and specific[0].priority == specific[1].priority:
            tied = [p.name for p in specific if p.priority == specific[0].priority]
            chosen = _generic(profiles, facts.arch)
            reason = f"conflicting evidence ({' and '.join(tied)} both match); generic fall-back"
        else:
            chosen = specific[0]
            evidence = next(r.evidence for r in results if r.profile == chosen.name)
            reason = "; ".join(evidence)
    if reason.startswith("conflicting") or forced:
        log.warning("hardware profile %s: %s", chosen.name, reason)
    else:
        log.info("hardware profile %s: %s", chosen.name, reason)
    accessories = tuple(
        f"{a.name}: {a.note}" for a in chosen.accessories if any(map(facts.has_device, a.devices))
    )
    return Detection(chosen, facts, reason, results, accessories)
