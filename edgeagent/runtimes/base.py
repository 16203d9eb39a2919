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
from typing import Any, Protocol, TypeGuard, runtime_checkable

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
    OpenVINO device (``CPU``, ``GPU``, ``NPU``, ``AUTO``), or for LiteRT ``CPU`` (XNNPACK),
    ``EDGETPU``, or ``DELEGATE`` with ``options["delegate"]`` naming the delegate library.

    ``input_names`` / ``output_names`` are the package's logical tensor names: a session renames
    the file's own tensors (a TFLite file calls its input ``serving_default_args_0``) so that the
    layers above see one vocabulary whatever the runtime.
    """

    files: tuple[Path, ...]
    device: str = "CPU"
    precision: str = "fp32"
    options: Mapping[str, Any] = field(default_factory=dict)
    threads: int | None = None
    cache_dir: Path | None = None
    layout: str | None = None  # NHWC when the file wants channels-last but clients send NCHW
    input_names: tuple[str, ...] | None = None
    output_names: tuple[str, ...] | None = None
    # The files' bytes, one per entry of ``files``, when the model must be loaded from memory
    # (a sealed variant decrypted for this load): ``files`` then only name them, and a runtime
    # writes nothing derived from them to disk (no compiled-model cache, no optimised copy).
    contents: tuple[bytes, ...] | None = field(default=None, repr=False)

    def file(self, suffixes: Sequence[str]) -> tuple[Path, bytes | None] | None:
        """The first file with one of ``suffixes``, and its bytes when they are in memory."""
        for index, path in enumerate(self.files):
            if path.suffix in suffixes:
                return path, None if self.contents is None else self.contents[index]
        return None


class Session(ABC):
    """A model loaded on a device, ready to run batches."""

    runtime: str
    device: str  # the device that actually runs it (may differ from what was asked, e.g. AUTO)
    precision: str

    @property
    @abstractmethod
    def inputs(self) -> Sequence[TensorInfo]: ...

    @property
    @abstractmethod
    def outputs(self) -> Sequence[TensorInfo]: ...

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Arrays carry the batch as their first dimension; any batch size works.

        Call it from one worker thread at a time; runtimes release the GIL while computing, so
        the caller runs this off the event loop.
        """

    def close(self) -> None:  # noqa: B027 - optional hook, most runtimes free on GC
        """Release native resources now rather than at garbage collection."""

    def fork(self) -> Session:
        """A fresh session of the same files on the same device, sharing no state with this
        one: a model whose state lives inside the runtime (TFLite resource variables) gets one
        per client sequence. Runtimes that keep no state between runs need not offer it."""
        raise RuntimeLoadError(f"{self.runtime} cannot open a second session of this model")


class Backend(Protocol):
    """Where a session runs, in the profile's words."""

    @property
    def runtime(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def precision(self) -> str: ...


@runtime_checkable
class ManagedSession(Protocol):
    """The optional extensions of a Session that manages several backends (the hardware
    layer's ResilientSession): the engine reports, steers and shows it through these."""

    @property
    def candidate(self) -> Backend | None:
        """The backend that runs now, or None while none works."""
        ...

    def set_power_mode(self, mode: str) -> None:
        """Prefer ``low``-power backends, or go back to the fastest (``high``)."""
        ...

    def status(self) -> dict[str, Any]:
        """JSON-able state of every backend, for /v1/status."""
        ...


_MANAGED_CLASSES: dict[type, bool] = {}  # is_managed's answer per session class


def is_managed(session: object) -> TypeGuard[ManagedSession]:
    """``isinstance(session, ManagedSession)``, decided once per class.

    A runtime-checkable Protocol's ``isinstance`` inspects the class's attributes on every
    call (8 µs here, on Python 3.11), and the engine asks on every request, several times. Every
    implementation declares the three members on its class, so the answer is the class's."""
    kind = type(session)
    known = _MANAGED_CLASSES.get(kind)
    if known is None:
        members = ("candidate", "set_power_mode", "status")
        known = _MANAGED_CLASSES[kind] = all(hasattr(kind, name) for name in members)
    return known


class Runtime(ABC):
    """A runtime plugin: knows its version and how to turn a variant into a Session."""

    name: str

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def devices(self) -> list[str]:
        """Devices the runtime *lists* here; a listed device still has to be proven by a load."""

    def lists(self, device: str) -> bool | None:
        """Whether ``device`` (a profile's name for it) is among ``devices()``: False means it
        cannot run here, so nothing should be fetched for it; None that the runtime cannot tell
        without loading a model there (only a probe can)."""
        return device in self.devices()

    @abstractmethod
    def load(self, request: LoadRequest) -> Session:
        """Load the files on ``request.device``; raise RuntimeLoadError with the runtime's text."""


class TensorNames:
    """Maps between a file's own tensor names and the package's logical names.

    With no logical names given, the file's names are used as they are. A feed dict keyed by
    other names of the right count is bound by position, which is what a single-input model
    caller means.
    """

    def __init__(self, native: Sequence[str], logical: Sequence[str] | None, kind: str) -> None:
        if logical is not None and len(logical) != len(native):
            raise RuntimeLoadError(
                f"the model file has {len(native)} {kind}(s) ({', '.join(native)}) but the "
                f"package declares {len(logical)} ({', '.join(logical)})"
            )
        self.native = list(native)
        self.logical = list(logical) if logical is not None else list(native)

    def bind(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Order the caller's feeds as the file's inputs."""
        if set(feeds) == set(self.logical):
            return [feeds[name] for name in self.logical]
        if set(feeds) == set(self.native):
            return [feeds[name] for name in self.native]
        if len(feeds) == len(self.native):
            return list(feeds.values())
        raise InferenceError(
            f"expected inputs {', '.join(self.logical)}, got {', '.join(feeds) or 'none'}"
        )

    def name_outputs(self, values: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.logical, values, strict=True))


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


def logical_shape(shape: Sequence[int], layout: str | None) -> tuple[int, ...]:
    """Report an NHWC file's input shape as the NCHW shape clients send."""
    dims = tuple(int(d) for d in shape)
    if layout == "NHWC" and len(dims) == 4:
        return (dims[0], dims[3], dims[1], dims[2])
    return dims
