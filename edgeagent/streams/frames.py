"""Decoded frames and the bounded slot between a source's decoder thread and its pipeline.

The slot holds at most ``capacity`` frames; a new frame on a full slot pushes the oldest out
(counted), so a detector slower than the camera costs frames, never memory or latency: what
the pipeline takes next is always the newest the camera has sent (the failure of trackers
that queue without bound and process ever older frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image


@dataclass(frozen=True)
class Frame:
    """One decoded frame, as the source took it."""

    image: Image.Image  # RGB
    captured_at: float  # wall-clock time the frame was decoded (time.time())
    seq: int  # per source, counting every frame taken


class FrameSlot:
    """A bounded, drop-oldest hand-over from one producer thread to one asyncio consumer."""

    def __init__(self, capacity: int, loop: asyncio.AbstractEventLoop) -> None:
        self.capacity = capacity
        self.dropped = 0  # frames pushed out unprocessed by a newer one
        self._frames: deque[Frame] = deque()
        self._lock = threading.Lock()
        self._loop = loop
        self._ready = asyncio.Event()

    def put(self, frame: Frame) -> None:
        """From the decoder thread: keep ``frame``, dropping the oldest when full."""
        with self._lock:
            if len(self._frames) >= self.capacity:
                self._frames.popleft()
                self.dropped += 1
            self._frames.append(frame)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody reads this frame
            self._loop.call_soon_threadsafe(self._ready.set)

    async def get(self) -> Frame:
        """The oldest frame still held (waits for one)."""
        while True:
            with self._lock:
                if self._frames:
                    return self._frames.popleft()
                self._ready.clear()  # a put after this schedules set(): no wake-up is lost
            await self._ready.wait()

    def __len__(self) -> int:
        with self._lock:
            return len(self._frames)
