"""[capture]: collecting hard samples on the device (off by default) and sending them to the hub.

Every limit that protects the device is here: what is sampled (confidence band, labels,
sampling percentage, caps per minute/hour/day), how much it may keep (MiB on disk, retention,
image size and JPEG quality), how much the hook may queue, and what the upload may use
(bandwidth, schedule). A model's ``[capture]`` table in ``model.toml`` may narrow these or
forbid capture of that model (``no_capture``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgeagent.sections import computed_setting, require, setting

SCHEDULE_RE = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True)
class CaptureSettings:
    enabled: bool = setting(False, "capture samples of the models' inputs (off: nothing is kept)")
    models: list[str] = computed_setting(
        list, "models to capture; empty = every model whose model.toml does not forbid it"
    )
    min_confidence: float = setting(
        0.0, "capture only answers whose top score is at least this (the hard band)", "0-1"
    )
    max_confidence: float = setting(
        1.0, "capture only answers whose top score is at most this (e.g. 0.6: unsure ones)", "0-1"
    )
    labels: list[str] = computed_setting(
        list, "capture only answers naming one of these labels; empty = any label"
    )
    sample_percent: float = setting(
        10.0, "of the answers that pass the rules, the share kept (random)", "%"
    )
    per_minute: int = setting(10, "samples kept per model per minute (0 = no cap)")
    per_hour: int = setting(100, "samples kept per model per hour (0 = no cap)")
    per_day: int = setting(500, "samples kept per model per day (0 = no cap)")
    max_disk_mib: float = setting(
        256.0, "the sealed spool's size; full = new samples dropped", "MiB"
    )
    retention_days: float = setting(
        7.0, "samples older than this are deleted (uploaded or not)", "days"
    )
    max_image_side: int = setting(
        640, "images are shrunk to at most this many pixels on their longer side", "px"
    )
    jpeg_quality: int = setting(85, "JPEG quality of the stored image", "1-95")
    queue_size: int = setting(
        32, "answered requests waiting for the capture worker; full = dropped (counted)"
    )
    redact_detector: str = setting(
        "",
        "a detector model this agent serves whose boxes are blurred before anything is "
        "written (faces, plates); empty = no redaction",
    )
    redact_labels: list[str] = computed_setting(
        list, "the detector's labels to blur; empty = every box it finds"
    )
    redact_min_score: float = setting(0.3, "blur boxes scored at least this", "0-1")
    # --- upload to the hub ---
    upload: bool = setting(False, "send samples to the hub (also needs the hub to allow the group)")
    hub_url: str = setting("", "the hub server's URL, e.g. https://hub.example:8400")
    token_file: Path | None = setting(
        None, "file holding this device's upload token (the hub's devices token file)"
    )
    bandwidth_bytes_per_s: int = setting(65536, "upload bandwidth cap", "bytes/s")
    schedule: list[str] = computed_setting(
        list, 'local-time windows uploads may run in, e.g. ["01:00-05:00"]; empty = any time'
    )
    upload_interval_s: float = setting(60.0, "how often the uploader looks for work", "s")
    ca_file: Path | None = setting(None, "CA bundle for an https hub; None = system store")

    def validate(self) -> None:
        section = "capture"
        for key in ("min_confidence", "max_confidence", "redact_min_score"):
            value = getattr(self, key)
            require(0.0 <= value <= 1.0, section, key, f"must be between 0 and 1, got {value}")
        require(
            self.min_confidence <= self.max_confidence,
            section,
            "min_confidence",
            "must not be above max_confidence",
        )
        require(
            0.0 <= self.sample_percent <= 100.0,
            section,
            "sample_percent",
            "must be 0..100",
        )
        for key in ("per_minute", "per_hour", "per_day"):
            require(getattr(self, key) >= 0, section, key, "must be 0 (no cap) or more")
        require(self.max_disk_mib > 0, section, "max_disk_mib", "must be positive")
        require(self.retention_days > 0, section, "retention_days", "must be positive")
        require(16 <= self.max_image_side <= 8192, section, "max_image_side", "must be 16..8192")
        require(1 <= self.jpeg_quality <= 95, section, "jpeg_quality", "must be 1..95")
        require(1 <= self.queue_size <= 10_000, section, "queue_size", "must be 1..10000")
        require(
            self.bandwidth_bytes_per_s > 0, section, "bandwidth_bytes_per_s", "must be positive"
        )
        require(self.upload_interval_s > 0, section, "upload_interval_s", "must be positive")
        for window in self.schedule:
            require(
                bool(SCHEDULE_RE.match(window)),
                section,
                "schedule",
                f"{window!r} is not HH:MM-HH:MM",
            )
        require(
            not self.upload or bool(self.hub_url),
            section,
            "hub_url",
            "upload = true needs the hub's URL",
        )
        require(
            not self.upload or self.token_file is not None,
            section,
            "token_file",
            "upload = true needs the device's upload token file",
        )
        require(
            not self.hub_url or self.hub_url.startswith(("http://", "https://")),
            section,
            "hub_url",
            f"{self.hub_url!r} is not an http(s) URL",
        )
