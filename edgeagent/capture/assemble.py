"""Capture's parts as the daemon runs them: the worker fed by a data-plane hook, the redaction
detector called as an internal request, and the uploader when ``[capture] upload`` is on.

The daemon only passes what capture needs of the rest of the agent (the data plane, the device
key, the metrics registry); how those become a hook, a spool key and services is decided here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from prometheus_client import CollectorRegistry

from edgeagent.capture.service import Capture
from edgeagent.capture.settings import CaptureSettings
from edgeagent.capture.spool import spool_key
from edgeagent.capture.uploader import Uploader
from edgeagent.engine.dataplane import DataPlane


@dataclass
class CaptureParts:
    """The capture worker, the services to start in order, and their /v1/status providers."""

    capture: Capture
    services: list[Any] = field(default_factory=list)
    status: dict[str, Callable[[], dict]] = field(default_factory=dict)


def assemble_capture(
    settings: CaptureSettings,
    state_dir: Path,
    device_key: Callable[[], X25519PrivateKey],
    *,
    device_id: str,
    dataplane: DataPlane,
    metrics: CollectorRegistry,
) -> CaptureParts:
    """Capture hooked onto ``dataplane``: its worker, and the uploader when asked."""
    detector = None
    if settings.redact_detector:
        name = settings.redact_detector

        async def detector(image: bytes) -> dict:
            return await dataplane.detect(name, None, image, internal=True)

    capture = Capture(
        settings,
        state_dir,
        lambda: spool_key(device_key()),
        device_id=device_id,
        detector=detector,
        metrics=metrics,
    )
    dataplane.hooks.add(capture.hook)
    parts = CaptureParts(capture, [capture], {"capture": capture.status})
    if settings.upload:
        uploader = Uploader(settings, capture.spool, capture.audit)
        parts.services.append(uploader)
        parts.status["capture_upload"] = uploader.status
    return parts
