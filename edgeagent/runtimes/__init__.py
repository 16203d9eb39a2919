"""Runtime plugins, one module each, imported only when asked for.

An optional runtime that is not installed is reported by ``runtime_status`` and skipped; it is
never an import error for the agent as a whole.

The plugin contract (``base``: Session, Runtime, the errors) is re-exported here but loaded on
first use (PEP 562): it needs numpy, and importing this package is also the way to
``runtimes.facts``, the one table of runtime names and file suffixes, which the package reader
needs in processes that never run a model (the hub signing a release).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from importlib import metadata
from typing import TYPE_CHECKING

from edgeagent.runtimes.facts import RUNTIME_FACTS

if TYPE_CHECKING:
    from edgeagent.runtimes.base import (
        InferenceError,
        LoadRequest,
        Runtime,
        RuntimeLoadError,
        RuntimeUnavailable,
        Session,
        TensorInfo,
    )

_CONTRACT = (
    "InferenceError",
    "LoadRequest",
    "Runtime",
    "RuntimeLoadError",
    "RuntimeUnavailable",
    "Session",
    "TensorInfo",
)

PLUGINS = {name: facts.module for name, facts in RUNTIME_FACTS.items()}
# The Python distributions that provide each runtime, in order of preference. Reading their
# metadata tells the version without importing the runtime (tens of MB of native libraries).
DISTRIBUTIONS = {name: facts.distributions for name, facts in RUNTIME_FACTS.items()}

_loaded: dict[str, Runtime] = {}


def __getattr__(name: str) -> object:
    """The contract's names from ``base``, imported the first time one is asked for."""
    if name in _CONTRACT:
        from edgeagent.runtimes import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.lru_cache(maxsize=32)
def installed_version(name: str) -> str:
    """The runtime's installed version, from package metadata; RuntimeUnavailable if none.

    Probe caches are keyed by this, so an agent restarting with cached probe results imports
    only the runtimes its chosen candidates need. Remembered for the process's life (a runtime
    installed later is imported by the next start anyway): each lookup scans every
    distribution on ``sys.path``, and the updater asks for every release it considers — a
    sixth of an install's CPU in the fleet simulator's profile.
    """
    from edgeagent.runtimes.base import RuntimeUnavailable

    for distribution in DISTRIBUTIONS.get(name, ()):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeUnavailable(
        f"runtime {name!r} is not installed (none of: {', '.join(DISTRIBUTIONS.get(name, ()))})"
    )


def disable_vendor_telemetry() -> None:
    """Stop onnxruntime and OpenVINO from writing telemetry into a (read-only) home directory."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    # OpenVINO has no environment switch: hiding its telemetry package selects the no-op stub.
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]


def get_runtime(name: str) -> Runtime:
    """Return the plugin for ``name``; RuntimeUnavailable says why it cannot be used here."""
    from edgeagent.runtimes.base import RuntimeUnavailable

    if name not in PLUGINS:
        raise RuntimeUnavailable(f"unknown runtime {name!r} (known: {', '.join(PLUGINS)})")
    if name not in _loaded:
        disable_vendor_telemetry()
        module = importlib.import_module(PLUGINS[name])
        _loaded[name] = module.create()
    return _loaded[name]


def runtime_status(load: bool = True) -> dict[str, dict[str, object]]:
    """Every known runtime with its version, listed devices, or the reason it is unavailable.

    With ``load=False`` a runtime not yet imported is described from its package metadata
    alone (no device list), so that a status report never pulls a runtime into memory.
    """
    from edgeagent.runtimes.base import RuntimeUnavailable

    status: dict[str, dict[str, object]] = {}
    for name in PLUGINS:
        try:
            if not load and name not in _loaded:
                status[name] = {"available": True, "version": installed_version(name)}
                continue
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
    "installed_version",
    "runtime_status",
]
