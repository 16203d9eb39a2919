"""``[streams]`` (what every camera shares: spool, snapshots, Home Assistant) and ``[[stream]]``
(one camera each): every limit that protects the device from a camera is a key here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeagent.sections import computed_setting, require, setting

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")  # a topic level and a Home Assistant object id


@dataclass(frozen=True)
class StreamsSettings:
    """[streams]: what all cameras share — the event spool, the snapshots, Home Assistant."""

    spool_dir: Path | None = setting(
        None, "where events wait while the broker is away; unset = <state_dir>/streams/spool"
    )
    spool_max_events: int = setting(
        10000, "events kept while the broker is away; then the oldest are dropped (counted)"
    )
    spool_max_bytes: int = setting(16 * 1024 * 1024, "disk the event spool may use", "bytes")
    snapshot_dir: Path | None = setting(
        None, "JPEG snapshots of tracked objects; unset = <state_dir>/streams/snapshots"
    )
    snapshot_max_bytes: int = setting(
        64 * 1024 * 1024, "disk the snapshots may use; the oldest are removed first", "bytes"
    )
    snapshot_max_age_s: float = setting(24 * 3600.0, "snapshots older than this are removed", "s")
    snapshot_quality: int = setting(80, "JPEG quality of snapshots (1..95)")
    discovery: bool = setting(True, "publish Home Assistant MQTT discovery configs")
    discovery_prefix: str = setting("homeassistant", "Home Assistant's MQTT discovery prefix")

    def validate(self) -> None:
        require(self.spool_max_events >= 1, "streams", "spool_max_events", "must be at least 1")
        require(self.spool_max_bytes >= 4096, "streams", "spool_max_bytes", "must be ≥ 4096")
        require(self.snapshot_max_bytes >= 0, "streams", "snapshot_max_bytes", "must be ≥ 0")
        require(self.snapshot_max_age_s > 0, "streams", "snapshot_max_age_s", "must be positive")
        require(1 <= self.snapshot_quality <= 95, "streams", "snapshot_quality", "must be 1..95")
        require(
            bool(self.discovery_prefix) and not any(c in self.discovery_prefix for c in "+#"),
            "streams",
            "discovery_prefix",
            "must be non-empty and contain no MQTT wildcards (+ #)",
        )


@dataclass(frozen=True)
class StreamSettings:
    """One ``[[stream]]`` table: a camera, how its frames are taken and what runs on them."""

    name: str = setting("", "the stream's name in topics, status and Home Assistant (required)")
    url: str = setting(
        "", "rtsp://…, http(s)://… (MJPEG), /dev/videoN (V4L2) or a video file path (required)"
    )
    rtsp_transport: Literal["tcp", "udp"] = setting("tcp", "RTSP media over TCP or UDP")
    loop: bool = setting(True, "a file source starts again at its end (a camera that never ends)")
    fps: float = setting(5.0, "frames taken per second; the others are decoded and skipped", "fps")
    max_frame_age_s: float = setting(
        2.0, "a frame older than this (from its capture) is never processed, only counted", "s"
    )
    frame_slots: int = setting(
        1, "decoded frames waiting for the detector; the oldest go first (1 = always the newest)"
    )
    open_timeout_s: float = setting(10.0, "opening the source; then it counts as failed", "s")
    read_timeout_s: float = setting(5.0, "no packet for this long = stalled: reconnect", "s")
    reconnect_min_s: float = setting(0.5, "first reconnect back-off; doubles each failure", "s")
    reconnect_max_s: float = setting(30.0, "longest reconnect back-off", "s")
    hwaccel: str = setting(
        "", "hardware decoding: cuda, qsv, drm, vaapi …; empty = software; unavailable = software"
    )
    max_pixels: int = setting(
        3840 * 2160, "a larger frame is refused (the source is reported failed)", "pixels"
    )
    model: str = setting("coco_ssd", "the detection package run on every taken frame")
    priority: int = setting(5, "engine priority of its frames (1 = most urgent; HTTP's is 2)")
    min_score: float = setting(0.5, "detections below this score are ignored")
    labels: list[str] = computed_setting(list, "labels tracked; empty = every label")
    zones: dict[str, list] = computed_setting(
        dict,
        "name = [[x, y], …]: polygons in 0..1 of the frame; an object is in a zone when "
        "its bottom centre is",
    )
    masks: list[list] = computed_setting(
        list, "[[x, y], …] polygons in 0..1 of the frame where detections are ignored"
    )
    classifier: str = setting("", "a second model run on each new track's crop; empty = none")
    iou_threshold: float = setting(0.3, "a detection continues a track when their IoU is this")
    min_hits: int = setting(2, "frames a track must be seen before its start event")
    max_missed: int = setting(5, "frames a track may go unseen before its end event")
    update_interval_s: float = setting(
        5.0, "an update event per track at most this often (box moved or score rose)", "s"
    )
    snapshots: bool = setting(True, "keep a JPEG of each track at its start")

    def validate(self) -> None:
        where = f"stream {self.name or '?'}"
        require(bool(NAME.match(self.name)), "stream", "name", "must match [a-z0-9][a-z0-9_-]*")
        require(bool(self.url), "stream", "url", f"{where}: is required")
        require(0 < self.fps <= 60, "stream", "fps", f"{where}: must be in (0, 60]")
        require(self.max_frame_age_s > 0, "stream", "max_frame_age_s", "must be positive")
        require(1 <= self.frame_slots <= 64, "stream", "frame_slots", "must be 1..64")
        for key in ("open_timeout_s", "read_timeout_s"):
            require(getattr(self, key) > 0, "stream", key, "must be positive")
        require(
            0 < self.reconnect_min_s <= self.reconnect_max_s,
            "stream",
            "reconnect_min_s",
            "must be positive and not above reconnect_max_s",
        )
        require(self.max_pixels > 0, "stream", "max_pixels", "must be positive")
        require(bool(self.model), "stream", "model", "must name a detection package")
        require(self.priority >= 1, "stream", "priority", "must be at least 1")
        require(0 <= self.min_score <= 1, "stream", "min_score", "must be between 0 and 1")
        require(0 < self.iou_threshold < 1, "stream", "iou_threshold", "must be in (0, 1)")
        require(self.min_hits >= 1, "stream", "min_hits", "must be at least 1")
        require(self.max_missed >= 0, "stream", "max_missed", "must be at least 0")
        require(self.update_interval_s > 0, "stream", "update_interval_s", "must be positive")
        for name, polygon in self.zones.items():
            require(bool(NAME.match(name)), "stream", "zones", f"zone name {name!r}: [a-z0-9_-]")
            require(polygon_ok(polygon), "stream", "zones", f"zone {name!r}: {POLYGON}")
        for polygon in self.masks:
            require(polygon_ok(polygon), "stream", "masks", POLYGON)

    @property
    def kind(self) -> str:
        """rtsp, mjpeg, v4l2 or file: from the url's shape."""
        if self.url.startswith(("rtsp://", "rtsps://")):
            return "rtsp"
        if self.url.startswith(("http://", "https://")):
            return "mjpeg"
        if self.url.startswith("/dev/video"):
            return "v4l2"
        return "file"


POLYGON = "must be a list of at least 3 [x, y] points, each coordinate in 0..1"


def polygon_ok(polygon: object) -> bool:
    """At least three [x, y] points in the frame's 0..1 coordinates."""
    if not isinstance(polygon, list) or len(polygon) < 3:
        return False
    return all(
        isinstance(p, list)
        and len(p) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in p)
        for p in polygon
    )


def streams_problem(streams: tuple[StreamSettings, ...]) -> str | None:
    """Two cameras with one name would share topics and entities: refused."""
    names = [s.name for s in streams]
    twice = sorted({n for n in names if names.count(n) > 1})
    return f"stream name(s) {', '.join(twice)} used twice" if twice else None
