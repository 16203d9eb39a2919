"""Runtime plugins, one module each, imported only when asked for.

An optional runtime that is not installed is reported by ``runtime_status`` and skipped; it is
never an import error for the agent as a whole.
"""

from __future__ import annotations

import importlib
import os
import sys

from edgeagent.runtimes.base import (
    InferenceError,
    LoadRequest,
    Runtime,
    RuntimeLoadError,
    RuntimeUnavailable,
    Session,
    TensorInfo,
)

PLUGINS = {
    "onnxruntime": "edgeagent.runtimes.onnx",
    "litert": "edgeagent.runtimes.litert",
    "openvino": "edgeagent.runtimes.openvino",
}

_loaded: dict[str, Runtime] = {}


def disable_vendor_telemetry() -> None:
    """Stop onnxruntime and OpenVINO from writing telemetry into a (read-only) home directory."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    # OpenVINO has no environment switch: hiding its telemetry package selects the no-op stub.
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]


def get_runtime(name: str) -> Runtime:
    """Return the plugin for ``name``; RuntimeUnavailable says why it cannot be used here."""
    if name not in PLUGINS:
        raise RuntimeUnavailable(f"unknown runtime {name!r} (known: {', '.join(PLUGINS)})")
    if name not in _loaded:
        disable_vendor_telemetry()
        module = importlib.import_module(PLUGINS[name])
        _loaded[name] = module.create()
    return _loaded[name]


def runtime_status() -> dict[str, dict[str, object]]:
    """Every known runtime with its version, listed devices, or the reason it is unavailable."""
    status: dict[str, dict[str, object]] = {}
    for name in PLUGINS:
        try:
            runtime = get_runtime(name)
            status[name] = {
                "available": True,
                "version": runtime.version(),
                "devices": runtime.devices(),
            }
        except RuntimeUnavailable as exc:
            status[name] = {"available": False, "reason": str(exc)}
    return status


__all__ = [
    "PLUGINS",
    "InferenceError",
    "LoadRequest",
    "Runtime",
    "RuntimeLoadError",
    "RuntimeUnavailable",
    "Session",
    "TensorInfo",
    "get_runtime",
    "runtime_status",
]
