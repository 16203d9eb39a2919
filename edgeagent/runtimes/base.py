"""The one contract every inference runtime plugin fulfils.

Kept deliberately small (load → session; session.run; session.close), like Frigate's
DetectionApi and MLServer's MLModel: everything above it (probing, fallback, batching) is written
once against this contract instead of once per runtime.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


class RuntimeUnavailable(RuntimeError):
    """The runtime's Python package is not installed or cannot be imported here."""


class RuntimeLoadError(RuntimeError):
    """A model could not be loaded on the requested device; the message is the runtime's own."""


class InferenceError(RuntimeError):
    """A loaded session failed while running."""


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the runtime sees it; dtype is a numpy dtype name, -1 a variable dimension."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class LoadRequest:
    """Everything needed to place one variant on one device.

    ``device`` uses each runtime's own vocabulary: an onnxruntime execution provider
    (``CPUExecutionProvider``, ``CUDAExecutionProvider``, ``TensorrtExecutionProvider`` …), an
    OpenVINO device (``CPU``, ``GPU``, ``NPU``, ``AUTO``), or for LiteRT ``CPU`` (XNNPACK) or
    ``DELEGATE`` with ``options["delegate"]`` naming the external delegate library.
    """

    files: tuple[Path, ...]
    device: str = "CPU"
    precision: str = "fp32"
    options: Mapping[str, Any] = field(default_factory=dict)
    threads: int | None = None
    cache_dir: Path | None = None
    layout: str | None = None  # NHWC when the file wants channels-last but clients send NCHW


class Session(ABC):
    """A model loaded on a device, ready to run batches."""

    runtime: str
    device: str  # the device that actually runs it (may differ from what was asked, e.g. AUTO)

    @property
    @abstractmethod
    def inputs(self) -> Sequence[TensorInfo]: ...

    @property
    @abstractmethod
    def outputs(self) -> Sequence[TensorInfo]: ...

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Arrays carry the batch as their first dimension; any batch size works.

        Thread-safe to call from one worker thread at a time; runtimes release the GIL while
        computing, so the caller runs this off the event loop.
        """

    def close(self) -> None:  # noqa: B027 - optional hook, most runtimes free on GC
        """Release native resources now rather than at garbage collection."""


class Runtime(ABC):
    """A runtime plugin: knows its version and how to turn a variant into a Session."""

    name: str

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def devices(self) -> list[str]:
        """Devices the runtime *lists* here; a listed device still has to be proven by a load."""

    @abstractmethod
    def load(self, request: LoadRequest) -> Session:
        """Load the files on ``request.device``; raise RuntimeLoadError with the runtime's text."""


def default_threads() -> int:
    """Intra-op threads when the profile says nothing: all cores the process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def to_layout(batch: np.ndarray, layout: str | None) -> np.ndarray:
    """Turn a client's NCHW image batch into the layout a variant file expects."""
    if layout == "NHWC" and batch.ndim == 4:
        return np.ascontiguousarray(batch.transpose(0, 2, 3, 1))
    return batch
