"""Failures of a runtime on arm64 that the agent survives, known and explained (not hidden).

Each entry: (runtime:precision, model) → (a piece of the runtime's own error, why). A check
reports a matching failure as KNOWN instead of failing, and an entry that no longer fails as
FIXED, so the list shrinks when a runtime release fixes it. A different error still fails.
The agent's answer to all of them is the same: the candidate fails its probe, the profile
falls back to the next candidate (docs/install/arm64-support.md).
"""

from __future__ import annotations

KNOWN: dict[tuple[str, str], tuple[str, str]] = {
    ("openvino:fp32", "shapes_grid_mnv2"): (
        "any_of(scale.size(), OC, 1U)",
        "OpenVINO 2026.4's aarch64 CPU plugin cannot compile the detector's FP32 IR "
        "(dnnl_postops_composer.cpp); the classifier's IRs compile and agree",
    ),
    ("openvino:int8", "shapes_grid_mnv2"): (
        "wrong answers on golden.npz",
        "OpenVINO 2026.4's aarch64 CPU plugin runs the detector's INT8 IR with wrong scores "
        "(0.57 for a golden 0.80 box); the probe's golden check refuses it (seen under qemu 7.2, "
        "not yet on a board)",
    ),
}


def known(run: str, model: str, error: str) -> str | None:
    """Why this failure is known, or None when it is not (a new failure)."""
    entry = KNOWN.get((run, model))
    if entry is None or entry[0] not in error:
        return None
    return entry[1]
