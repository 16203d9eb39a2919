"""Frigate's ``zmq`` detector protocol, answered by the agent's detector.

Frigate's ``zmq`` detector plugin (``frigate/detectors/plugins/zmq_ipc.py``) hands each frame
to an external process over a ZeroMQ REQ socket: a multipart request of a JSON header
(``shape``, ``dtype``, ``model_type``) and the raw tensor (the frame, already resized to the
model's size by Frigate, height × width × 3 uint8), answered by 20 × 6 float32 rows of
``[class, score, y_min, x_min, y_max, x_max]`` (corners as fractions of the frame, best first,
unused rows zero). Before the first frame it asks ``{"model_request": true}`` whether the model
is there and, if not, sends the model file itself.

Here the agent chooses the model (``[zmq] model``, a detection package) and its accelerator,
so a model request is answered with that model's readiness, and a model file Frigate offers is
never taken (a socket must not be a way to replace what the device runs). Each frame goes
through the data plane like an HTTP request — the package's own preprocessing, the governor,
batching with other clients — with no image encoding on either side, which is what makes this
path faster than DeepStack's JPEG over HTTP.

The socket is a ROUTER, so several Frigate detector processes (each a REQ) may share one
endpoint and be answered concurrently, up to ``max_in_flight`` frames at once. A frame that
cannot be read (wrong dtype, shape, size) or fails is answered with zero rows, as Frigate's
plugin itself answers its own errors, and counted in ``/v1/status``; ``MAXMSGSIZE`` refuses an
oversized message before it is buffered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from edgeagent.aio import cancel_and_wait, spawn
from edgeagent.api.listeners import ListenerError, claim_socket_path
from edgeagent.api.zmq.settings import ZmqSettings
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.errors import ServingError
from edgeagent.models.tasks.decode import Detections

log = logging.getLogger(__name__)

ROWS = 20  # Frigate's detectors answer at most 20 detections
RESULT_SHAPE = (ROWS, 6)
HEADER_BYTES = 64 * 1024  # a header is a few dozen bytes; with the frame, the message limit


class FrameError(ValueError):
    """A request that cannot be answered with detections; the message says why."""


def frame_pixels(header: dict[str, Any], payload: bytes, max_pixels: int) -> np.ndarray:
    """The frame of a tensor request as height × width × 3 uint8 (NHWC or NCHW, batch of 1)."""
    shape = header.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape
    ):
        raise FrameError(f"shape must be a list of positive integers, got {shape!r}")
    if header.get("dtype") != "uint8":
        raise FrameError(
            f"dtype {header.get('dtype')!r}: only uint8 frames are taken (Frigate's "
            "input_dtype: int, the default)"
        )
    dims = list(shape)
    while len(dims) > 3 and dims[0] == 1:
        dims.pop(0)
    if len(dims) != 3 or 3 not in (dims[0], dims[2]):
        raise FrameError(f"shape {shape} is not one RGB frame (NHWC or NCHW)")
    channels_last = dims[2] == 3
    height, width = (dims[0], dims[1]) if channels_last else (dims[1], dims[2])
    if height * width > max_pixels:
        raise FrameError(f"a frame of {width}×{height} is over [zmq] max_pixels {max_pixels}")
    if len(payload) != math.prod(dims):
        raise FrameError(f"{len(payload)} bytes of tensor for shape {shape}")
    pixels = np.frombuffer(payload, np.uint8).reshape(dims)
    return pixels if channels_last else np.ascontiguousarray(pixels.transpose(1, 2, 0))


def result_rows(found: Detections, width: int, height: int) -> np.ndarray:
    """Frigate's 20 × 6 float32 answer: class, score, then the box as fractions of the frame."""
    rows = np.zeros(RESULT_SHAPE, np.float32)
    count = min(ROWS, len(found))
    if count:
        boxes = found.boxes[:count]  # x_min, y_min, x_max, y_max in the frame's pixels
        rows[:count, 0] = found.classes[:count]
        rows[:count, 1] = found.scores[:count]
        rows[:count, 2] = boxes[:, 1] / height
        rows[:count, 3] = boxes[:, 0] / width
        rows[:count, 4] = boxes[:, 3] / height
        rows[:count, 5] = boxes[:, 2] / width
    return rows


class ZmqDetector:
    """The [zmq] listener: a service of the daemon (started after the models, stopped first)."""

    def __init__(self, settings: ZmqSettings, dataplane: DataPlane, model: str) -> None:
        self.settings = settings
        self.dataplane = dataplane
        self.model = settings.model or model
        self.address = settings.address
        self.frames = 0
        self.refused = 0
        self.failed = 0
        self.last_error = ""
        self._context: Any = None
        self._socket: Any = None
        self._task: asyncio.Task | None = None
        self._answering: set[asyncio.Task] = set()
        self._ipc: Path | None = None

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        parts = urlsplit(self.address)
        if parts.scheme == "ipc":
            self._ipc = Path(parts.netloc + parts.path)
            claim_socket_path(self._ipc)
        self._context = zmq.asyncio.Context()
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_pixels * 3 + HEADER_BYTES)
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ListenerError(f"[zmq] endpoint {self.address}: {exc}") from exc
        if self._ipc is not None:
            os.chmod(self._ipc, self.settings.socket_mode)
        self._socket = sock
        self._task = spawn(self._serve(), name="zmq-detector")
        log.info("Frigate's zmq detector answered on %s by %s", self.address, self.model)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task, *self._answering])
        if self._socket is not None:
            self._socket.close(linger=0)
        if self._context is not None:
            self._context.term()
        if self._ipc is not None and self._ipc.is_socket():
            self._ipc.unlink()

    def status(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "endpoint": self.address,
            "model": self.model,
            "frames": self.frames,
            "refused": self.refused,
            "failed": self.failed,
        }
        if self.last_error:
            shown["last_error"] = self.last_error
        return shown

    async def _serve(self) -> None:
        slots = asyncio.Semaphore(self.settings.max_in_flight)
        while True:
            message = await self._socket.recv_multipart()
            await slots.acquire()  # at most max_in_flight frames held; the rest wait in zmq
            task = spawn(self._answer(message, slots), name="zmq-frame")
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)

    async def _answer(self, message: list[bytes], slots: asyncio.Semaphore) -> None:
        try:
            if b"" not in message:  # not a REQ's envelope: nobody to answer
                return
            split = message.index(b"")
            envelope, frames = message[: split + 1], message[split + 1 :]
            reply = await self.answer(frames)
        finally:
            slots.release()
        await self._socket.send_multipart([*envelope, *reply])

    async def answer(self, frames: list[bytes]) -> list[bytes]:
        """The reply frames to one request's frames (the protocol without the socket)."""
        try:
            header = json.loads(frames[0]) if frames else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            header = None
        if not isinstance(header, dict):
            return self._refuse("the first frame is not a JSON header")
        if header.get("model_request") or header.get("model_data"):
            return [json.dumps(self._model_answer(header)).encode()]
        if len(frames) != 2:
            return self._refuse(f"a tensor request is 2 frames, not {len(frames)}")
        try:
            pixels = frame_pixels(header, frames[1], self.settings.max_pixels)
        except FrameError as exc:
            return self._refuse(str(exc))
        try:
            _, found = await self.dataplane.detect_pixels(
                self.model, pixels, self.settings.min_score
            )
        except ServingError as exc:
            self.failed += 1
            self.last_error = str(exc)
            log.debug("zmq detector: %s", exc)
            return [np.zeros(RESULT_SHAPE, np.float32).tobytes()]
        self.frames += 1
        height, width = pixels.shape[:2]
        return [result_rows(found, width, height).tobytes()]

    def _model_answer(self, header: dict[str, Any]) -> dict[str, bool]:
        try:
            ready = self.dataplane.model_ready(self.model)
        except ServingError as exc:  # not served at all: [zmq] model names no package here
            log.error("zmq detector: %s", exc)
            ready = False
        if header.get("model_data"):
            log.warning(
                "zmq detector: Frigate offered the model file %r; not taken (the agent serves "
                "%s, chosen by [zmq] model)",
                header.get("model_name"),
                self.model,
            )
            return {"model_saved": False, "model_loaded": ready}
        return {"model_available": True, "model_loaded": ready}

    def _refuse(self, why: str) -> list[bytes]:
        self.refused += 1
        self.last_error = why
        log.debug("zmq detector: %s", why)
        return [np.zeros(RESULT_SHAPE, np.float32).tobytes()]
