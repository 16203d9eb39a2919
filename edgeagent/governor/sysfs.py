"""Reading sysfs attributes the way the kernel serves them, below a configurable root.

sysfs attributes fail in their own ways: a file that vanishes with its device, EINVAL/ENODATA
from a driver whose hardware is powered down, or text that is not a number. All of them mean
"this sensor is offline now", which the governor must never confuse with a reading of zero.
"""

from __future__ import annotations

import errno
from pathlib import Path


class SensorOffline(Exception):
    """The sensor gave no usable value; the message says which file and why."""


def read_text(path: Path) -> str:
    """The attribute's content without the trailing newline; SensorOffline on any OS error."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError as exc:
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0, "unreadable")
        raise SensorOffline(f"{path}: {reason}") from exc


def read_int(path: Path) -> int:
    """An integer attribute (sysfs numbers are decimal ASCII)."""
    text = read_text(path)
    try:
        return int(text)
    except ValueError:
        raise SensorOffline(f"{path}: not a number: {text[:40]!r}") from None


def below(root: Path, absolute: str) -> Path:
    """``/sys/class/thermal`` under ``root`` (the real root is "/")."""
    return root / absolute.lstrip("/")


def find_by_name(directory: Path, pattern: str, name: str, attribute: str = "name") -> list[Path]:
    """Entries of ``directory`` matching ``pattern`` whose ``attribute`` file reads ``name``.

    Sensors are found by name, never by index: the kernel numbers thermal zones and hwmon
    devices in probe order, which changes between kernels and boots.
    """
    found = []
    for entry in sorted(directory.glob(pattern), key=_natural):
        try:
            if read_text(entry / attribute) == name:
                found.append(entry)
        except SensorOffline:
            continue
    return found


def _natural(path: Path) -> tuple[str, int]:
    """Sort hwmon10 after hwmon9."""
    stem = path.name.rstrip("0123456789")
    digits = path.name[len(stem) :]
    return (str(path.parent / stem), int(digits) if digits else -1)
