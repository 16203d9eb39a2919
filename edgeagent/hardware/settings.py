"""[hardware]: where board facts are read from and how a variant is chosen and kept working."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeagent.models.serving_hints import spread_problem
from edgeagent.sections import require, setting


@dataclass(frozen=True)
class HardwareSettings:
    root: Path = setting(
        Path("/"), "read sysfs/procfs/device nodes below this (tests use fake trees)"
    )
    profiles_dir: Path | None = setting(
        None, "extra device profiles; one named like a shipped profile replaces it"
    )
    profile: str = setting("", "force a profile by name instead of detecting")
    choice: Literal["ranked", "fastest"] = setting(
        "ranked", "ranked: first working candidate of the profile; fastest: time the top ones"
    )
    threads: int = setting(0, "intra-op threads; 0 = the profile's [threads], else every core")
    fastest_top_k: int = setting(3, "`fastest`: how many working candidates are timed")
    fastest_seconds: float = setting(1.0, "`fastest`: timing budget per candidate", "s")
    probe_timeout_s: float = setting(
        300.0, "one load + first inference (TensorRT engine builds are slow)", "s"
    )
    probe_failure_ttl_s: float = setting(
        86400.0, "a cached failed probe is retried after this long", "s"
    )
    probe_golden_agreement: float = setting(
        0.6, "share of golden top-1 a probe must match; 0 = off", "ratio"
    )
    probe_cache_entries: int = setting(
        1000, "probe results and decisions kept; the oldest go first"
    )
    failure_threshold: int = setting(3, "consecutive run errors that demote a candidate")
    reprobe_backoff_s: float = setting(
        30.0, "first re-probe of a demoted candidate after this long", "s"
    )
    reprobe_backoff_max_s: float = setting(3600.0, "back-off doubles up to this", "s")
    spread: int | list[str] = setting(
        1,
        "devices serving each model at once: up to N (the best working candidate of each), or "
        'the devices named (["NPU", "CPU"]); 1 = one device; model.toml [serving] spread wins',
    )

    def validate(self) -> None:
        require(self.threads >= 0, "hardware", "threads", "must be 0 (automatic) or more")
        require(self.fastest_top_k >= 1, "hardware", "fastest_top_k", "must be at least 1")
        require(self.fastest_seconds > 0, "hardware", "fastest_seconds", "must be positive")
        require(self.probe_timeout_s > 0, "hardware", "probe_timeout_s", "must be positive")
        require(self.probe_failure_ttl_s >= 0, "hardware", "probe_failure_ttl_s", "must be >= 0")
        require(
            0 <= self.probe_golden_agreement <= 1,
            "hardware",
            "probe_golden_agreement",
            "must be between 0 and 1",
        )
        require(self.probe_cache_entries >= 1, "hardware", "probe_cache_entries", "must be >= 1")
        require(self.failure_threshold >= 1, "hardware", "failure_threshold", "must be >= 1")
        require(self.reprobe_backoff_s > 0, "hardware", "reprobe_backoff_s", "must be positive")
        require(not spread_problem(self.spread), "hardware", "spread", spread_problem(self.spread))
        require(
            self.reprobe_backoff_max_s >= self.reprobe_backoff_s,
            "hardware",
            "reprobe_backoff_max_s",
            "must be at least reprobe_backoff_s",
        )
