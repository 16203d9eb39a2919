"""Maintenance windows per deployment stage (``"stage_windows"`` in a new deployment).

A window is signed into the release a device receives (``fleet.windows``), so a stage of its
own needs envelopes of its own: the server signs each batch anyway when it holds the release
key (``--release-key``), and then signs a stage's batches with that stage's window. Without the
key the server relays the uploaded envelope, whose window (``hub sign --window``) every stage
shares, so a per-stage window is refused there, as it is for an agent release (always relayed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgeagent.fleet.windows import MaintenanceWindow, WindowError


class StageWindowError(ValueError):
    """A ``stage_windows`` entry that cannot be used, said so the operator can fix it."""


def read_stage_windows(
    entries: Sequence[dict[str, Any]], stage_count: int, *, signs: bool, agent: bool
) -> dict[str, dict[str, str]] | None:
    """The stored form (stage number as text → window object) of the request's entries, each
    ``{"stage": N, "schedule": …, "timezone": …}`` with its types already checked."""
    if not entries:
        return None
    if agent:
        raise StageWindowError(
            "an agent release is relayed as uploaded: sign its window with hub sign --window"
        )
    if not signs:
        raise StageWindowError(
            "per-stage windows are signed into each stage's envelopes: start the server with "
            "--release-key, or sign one window for every stage with hub sign --window"
        )
    stored: dict[str, dict[str, str]] = {}
    for entry in entries:
        stage = entry["stage"]
        if not 1 <= stage <= stage_count:
            raise StageWindowError(f"stage {stage}: this deployment has stages 1-{stage_count}")
        if str(stage) in stored:
            raise StageWindowError(f"stage {stage} has two windows")
        window = {k: entry[k] for k in ("schedule", "timezone") if k in entry}
        try:
            stored[str(stage)] = MaintenanceWindow.parse(window).to_dict()
        except WindowError as exc:
            raise StageWindowError(f"stage {stage}: {exc}") from exc
    return stored


def stage_window(deployment: dict[str, Any]) -> MaintenanceWindow | None:
    """The window the deployment's current stage is signed with (None: the release's own)."""
    stored = (deployment.get("stage_windows") or {}).get(str(deployment["stage"]))
    return None if stored is None else MaintenanceWindow.parse(stored)
