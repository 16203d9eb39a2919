"""[updates]: signed model updates on the device (the broker link is [mqtt], in fleet)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.windows import WindowError, device_zone
from edgeagent.sections import computed_setting, require, setting


@dataclass(frozen=True)
class UpdateSettings:
    enabled: bool = setting(False, "take signed model updates from the hub over MQTT")
    # --- delivery (store, download, unpack, health gate) ---
    group: str = setting("default", "device group whose releases this device follows")
    device_class: str = setting("", "matched against a release's targets.device_classes")
    keep_releases: int = setting(
        2, "previous releases kept per model for rollback, besides current"
    )
    max_artifact_bytes: int = setting(
        512 * 1024 * 1024, "refuse bigger artifacts before downloading", "bytes"
    )
    max_unpacked_bytes: int = setting(
        1024 * 1024 * 1024, "total size of the files in one artifact", "bytes"
    )
    max_unpacked_files: int = setting(256, 'entries (files, directories, "./") in one artifact')
    max_tar_header_bytes: int = setting(
        64 * 1024, "a pax / GNU long-name header above this is refused", "bytes"
    )
    download_timeout_s: float = setting(
        900.0, "overall deadline for one artifact (all retries)", "s"
    )
    download_gap_s: float = setting(
        30.0, "longest silence between two reads before we give up on it", "s"
    )
    download_min_rate_bps: int = setting(
        1024, "slower than this on average (after 30 s) = slow-retrieval", "bytes/s"
    )
    download_retries: int = setting(5, "resumes after a dropped connection before giving up")
    free_space_margin_bytes: int = setting(
        64 * 1024 * 1024, "keep this much free after the download", "bytes"
    )
    health_timeout_s: float = setting(
        60.0, "load + warm + golden check must finish within this", "s"
    )
    golden_top_k: int = setting(
        5, "a golden input passes when its expected class is in the top-k (1 = exact top-1)"
    )
    llm_tokens_per_second_floor: float = setting(
        0.1,
        "a language model's health check: its golden chats must decode at least this × the "
        "tokens/s recorded at packaging (0 = no floor; the record is the packaging machine's)",
    )
    cpu_fallback_variant: bool = setting(
        True,
        "also download a release's best CPU variant when the chosen one needs an accelerator",
    )
    ca_file: Path | None = setting(None, "CA bundle for https artifact URLs; None = system store")
    failed_probe_memory_s: float = setting(
        30 * 86400.0,
        "an accelerator whose probe failed here keeps its variants out of downloads this long "
        "(for the same runtime version); 0 = download them anyway",
        "s",
    )
    # --- deltas (docs/fleet/deltas.md) ---
    keep_delta_bases: bool = setting(
        True,
        "keep the committed release's uncompressed tars, so the next release may come as a "
        "delta from them (one more copy of each model on disk)",
    )
    max_delta_base_bytes: int = setting(
        1024 * 1024 * 1024,
        "a base tar above this is neither kept nor patched (applying one holds it in memory)",
        "bytes",
    )
    # --- update locks and maintenance windows (docs/fleet/windows-and-locks.md) ---
    max_lock_hold_s: float = setting(
        3600.0,
        "longest hold a local app may ask for with POST /v1/update-lock; a lock held past it "
        "is broken (logged)",
        "s",
    )
    max_locks: int = setting(64, "update locks held at once (one per holder name)")
    timezone: str = setting(
        "",
        "this device's IANA time zone for maintenance windows (e.g. Europe/Berlin); "
        "empty = the system's local zone",
    )
    window_check_s: float = setting(
        15.0,
        "how often a deferred release re-checks its maintenance window and the locks "
        "(it also wakes at once on a lock's release)",
        "s",
    )
    # --- state report (retained on <p>/device/<id>/state) ---
    state_interval_s: float = setting(
        300.0, "re-publish the state report this often (heartbeat: last seen); 0 = off", "s"
    )
    max_state_bytes: int = setting(
        32 * 1024, "the state report is shrunk to fit (old history, then sections)", "bytes"
    )
    # --- canary (a release's canary table; thresholds it leaves out: [server] canary_*) ---
    canary_max_seconds: float = setting(
        600.0, "a canary's longest window when its release sets no max_seconds", "s"
    )
    canary_without_traffic: Literal["golden", "rollback"] = setting(
        "golden",
        "too few requests by max_seconds: golden = the passed golden check promotes it, "
        "rollback = roll it back",
    )
    canary_memory_factor: float = setting(
        2.0, "a loaded model is estimated at this × its variant files (canary memory check)"
    )
    canary_min_free_bytes: int = setting(
        64 * 1024 * 1024, "memory that must stay available with a canary loaded", "bytes"
    )
    # --- trust (signatures, trust store, manifests) ---
    trust_file: Path = setting(
        Path("/etc/edgeagent/trust.json"),
        "provisioned trust seed; rotations go to <state_dir>/trust/trust.json",
    )
    max_manifest_bytes: int = setting(
        MAX_ENVELOPE_BYTES, "envelopes (manifests, trust files) refused unread above", "bytes"
    )
    clock_skew_s: float = setting(
        300.0, "a release issued this far in the device's future is accepted", "s"
    )
    max_cancellations: int = setting(
        256, "signed cancellations of aborted deployments held until they expire (newest kept)"
    )
    # --- agent self-updates (selfupdate; docs/fleet/agent-updates.md) ---
    agent_root: Path | None = setting(
        None,
        "A/B install root of agent releases (versions/, current, previous); "
        "None = agent releases are refused",
    )
    agent_config_file: Path = setting(
        Path("/etc/edgeagent/agent.toml"),
        "the config the service runs with: a new agent must pass 'config check' on it first",
    )
    agent_keep_versions: int = setting(3, "agent versions kept under agent_root (current incl.)")
    agent_max_boots: int = setting(
        3, "starts a new agent may take to commit before the boot check rolls it back"
    )
    agent_commit_deadline_s: float = setting(
        600.0, "a new agent not committed this long after the switch is rolled back", "s"
    )
    agent_install_timeout_s: float = setting(
        600.0, "venv + pip install of a wheelhouse, and the new agent's config check", "s"
    )
    agent_extra_site_dirs: list[Path] = computed_setting(
        list,
        "site directories every agent venv also reads (a .pth), e.g. a distribution's "
        "dist-packages with vendor bindings such as TensorRT",
    )

    def validate(self) -> None:
        require(self.agent_keep_versions >= 2, "updates", "agent_keep_versions", "must be >= 2")
        require(1 <= self.agent_max_boots <= 100, "updates", "agent_max_boots", "must be 1..100")
        for key in ("agent_commit_deadline_s", "agent_install_timeout_s"):
            require(getattr(self, key) > 0, "updates", key, "must be positive")
        require(self.max_manifest_bytes > 0, "updates", "max_manifest_bytes", "must be positive")
        require(
            1 <= self.max_cancellations <= 100_000,
            "updates",
            "max_cancellations",
            "must be 1..100000",
        )
        require(
            0 <= self.clock_skew_s <= 86400, "updates", "clock_skew_s", "must be 0..86400 seconds"
        )
        for key in (
            "max_artifact_bytes",
            "max_unpacked_bytes",
            "max_unpacked_files",
            "max_tar_header_bytes",
        ):
            require(getattr(self, key) > 0, "updates", key, "must be positive")
        for key in ("download_timeout_s", "download_gap_s", "health_timeout_s"):
            require(getattr(self, key) > 0, "updates", key, "must be positive")
        require(
            self.max_delta_base_bytes > 0, "updates", "max_delta_base_bytes", "must be positive"
        )
        require(
            1 <= self.max_lock_hold_s <= 7 * 86400,
            "updates",
            "max_lock_hold_s",
            "must be 1..604800 seconds",
        )
        try:
            device_zone(self.timezone)
        except WindowError as exc:
            require(False, "updates", "timezone", str(exc))
        require(1 <= self.max_locks <= 10_000, "updates", "max_locks", "must be 1..10000")
        require(
            0.1 <= self.window_check_s <= 60, "updates", "window_check_s", "must be 0.1..60 seconds"
        )
        require(self.keep_releases >= 1, "updates", "keep_releases", "must be at least 1")
        require(self.golden_top_k >= 1, "updates", "golden_top_k", "must be at least 1")
        require(
            self.llm_tokens_per_second_floor >= 0,
            "updates",
            "llm_tokens_per_second_floor",
            "must be at least 0",
        )
        require(self.download_retries >= 0, "updates", "download_retries", "must be >= 0")
        require(
            self.state_interval_s == 0 or 1 <= self.state_interval_s <= 86400,
            "updates",
            "state_interval_s",
            "must be 0 (off) or 1..86400 seconds",
        )
        require(
            4096 <= self.max_state_bytes <= MAX_ENVELOPE_BYTES,
            "updates",
            "max_state_bytes",
            f"must be 4096..{MAX_ENVELOPE_BYTES} bytes",
        )
        require(
            0 <= self.failed_probe_memory_s <= 365 * 86400,
            "updates",
            "failed_probe_memory_s",
            "must be 0..31536000 seconds",
        )
        require(
            1 <= self.canary_max_seconds <= 7 * 86400,
            "updates",
            "canary_max_seconds",
            "must be 1..604800 seconds",
        )
        require(
            1 <= self.canary_memory_factor <= 100,
            "updates",
            "canary_memory_factor",
            "must be between 1 and 100",
        )
        require(self.canary_min_free_bytes >= 0, "updates", "canary_min_free_bytes", "must be >= 0")
        require(
            bool(self.group) and not any(c in self.group for c in "+#/"),
            "updates",
            "group",
            "must be non-empty without '+', '#' or '/' (it is one MQTT topic level)",
        )
