"""[hardware]: where board facts are read from and how a variant is chosen."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class HardwareSettings:
    root: Path = Path("/")  # read sysfs/procfs/device nodes below this (tests use fake trees)
    profiles_dir: Path | None = None  # default: the device_profiles shipped with the agent
    profile: str = ""  # force a profile by name instead of detecting
    choice: Literal["ranked", "fastest"] = "ranked"
