"""A camera: frames decoded with PyAV (FFmpeg) in a thread, sampled, handed to a FrameSlot.

Every source is a loop of *connect → stream → (closed | stalled | failed) → back off*: a
camera that restarts, a network that drops, a file that ends are all the same event, and
the source comes back by itself (exponential back-off, reset once frames flow again). Each
state change is logged and kept for ``/v1/status``.

Decoding runs in its own thread because FFmpeg's reads block; PyAV's ``timeout=(open, read)``
interrupts a read that waits longer than ``read_timeout_s``, so a stalled camera is noticed
and a stop never waits more than that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from edgeagent.streams.frames import Frame, FrameSlot
from edgeagent.streams.settings import StreamSettings

log = logging.getLogger(__name__)

# States a source reports; "ended" only for a file with loop = false, "stopped" after stop().
STATES = ("connecting", "streaming", "closed", "stalled", "failed", "backoff", "ended", "stopped")


class SourceError(RuntimeError):
    """A frame the source refuses (larger than ``max_pixels``)."""


def backoff(minimum: float, maximum: float) -> Iterator[float]:
    """minimum, 2×minimum, … capped at maximum (one camera: no jitter needed)."""
    delay = minimum
    while True:
        yield delay
        delay = min(maximum, delay * 2)


def open_args(settings: StreamSettings) -> dict[str, Any]:
    """``av.open`` keywords for the source's kind (the transport, the demuxer)."""
    kind = settings.kind
    args: dict[str, Any] = {"timeout": (settings.open_timeout_s, settings.read_timeout_s)}
    # Probe half a second, not FFmpeg's default five: a camera's first frame (and a reconnect's)
    # is then usable at once instead of arriving in a burst of stale ones.
    options = {"analyzeduration": "500000", "probesize": "1000000"}
    if kind == "rtsp":
        args["options"] = {**options, "rtsp_transport": settings.rtsp_transport}
    elif kind == "mjpeg":
        args["options"] = options
        args["format"] = "mpjpeg"
    elif kind == "v4l2":
        args["format"] = "video4linux2"
    return args


class Source:
    """One camera's decoder thread, its state and its counters."""

    def __init__(self, settings: StreamSettings, slot: FrameSlot) -> None:
        self.settings = settings
        self.slot = slot
        self.state = "stopped"
        self.since = time.time()
        self.error = ""
        self.connects = 0  # successful opens
        self.decoded = 0  # frames decoded (taken or skipped by the fps sampling)
        self.taken = 0  # frames handed to the slot
        self.resolution: tuple[int, int] | None = None
        self.resolution_changes = 0
        self.last_frame_at: float | None = None
        self.history: list[tuple[float, str, str]] = []  # (time, state, why): the last few
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition()  # notified on every state change
        self._heard = 0.0  # monotonic time of the last frame (or of the open's start)
        self.decoder = f"hardware ({settings.hwaccel})" if settings.hwaccel else "software"
        self._hwaccel = settings.hwaccel

    # -- control --------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"stream-{self.settings.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end and wait for it (at most a read time-out)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.read_timeout_s + self.settings.open_timeout_s + 5)
            self._thread = None
        self._set("stopped", "")

    def wait_until(self, predicate: Callable[[Source], bool], timeout: float) -> bool:
        """Block until ``predicate(self)`` holds (checked on each state change and frame taken);
        False on time-out."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    def status(self) -> dict[str, Any]:
        age = None if self.last_frame_at is None else round(time.time() - self.last_frame_at, 3)
        return {
            "url_kind": self.settings.kind,
            "decoder": self.decoder,
            "state": self.state,
            "since": round(self.since, 3),
            "error": self.error,
            "connects": self.connects,
            "frames_decoded": self.decoded,
            "frames_taken": self.taken,
            "frames_dropped": self.slot.dropped,
            "resolution": list(self.resolution) if self.resolution else None,
            "resolution_changes": self.resolution_changes,
            "last_frame_age_s": age,
            "history": [{"at": round(t, 3), "state": s, "why": why} for t, s, why in self.history],
        }

    # -- the thread ----------------------------------------------------------------------

    def _set(self, state: str, why: str) -> None:
        if state == self.state and why == self.error:
            return
        with self._changed:
            previous, self.state, self.since = self.state, state, time.time()
            if state in ("failed", "stalled", "closed"):
                self.error = why
            self.history = [*self.history[-15:], (self.since, state, why)]
            self._changed.notify_all()
        level = logging.WARNING if state in ("failed", "stalled", "closed") else logging.INFO
        log.log(
            level,
            "stream %s: %s -> %s%s",
            self.settings.name,
            previous,
            state,
            f" ({why})" if why else "",
        )

    def _run(self) -> None:
        try:
            import av
        except ImportError:
            self._set("failed", "PyAV is not installed: pip install 'edgeagent[streams]'")
            return

        delays = backoff(self.settings.reconnect_min_s, self.settings.reconnect_max_s)
        while not self._stop.is_set():
            self._set("connecting", self.settings.kind)
            taken_before = self.taken
            self._heard = time.monotonic()
            limit = self.settings.open_timeout_s
            try:
                with self._open() as container:
                    self.connects += 1
                    self._set("streaming", "")
                    self._heard, limit = time.monotonic(), self.settings.read_timeout_s
                    self._read(container)
                if self._stop.is_set():
                    break
                if self.settings.kind == "file" and not self.settings.loop:
                    self._set("ended", "end of file")
                    return
                if time.monotonic() - self._heard >= limit * 0.9:  # a time-out read as EOF
                    self._set("stalled", f"nothing received for {limit:g} s")
                else:
                    self._set("closed", "end of stream")
            except (av.FFmpegError, OSError, SourceError, ValueError) as exc:
                # Our time-out interrupting a blocked read surfaces as whatever error the
                # demuxer then reports (ExitError, InvalidDataError …): judged by the silence.
                if time.monotonic() - self._heard >= limit * 0.9:
                    self._set("stalled", f"nothing received for {limit:g} s")
                else:
                    self._set("failed", str(exc) or type(exc).__name__)
            if self._stop.is_set():
                break
            if self.taken > taken_before:  # it worked for a while: start the back-off afresh
                delays = backoff(self.settings.reconnect_min_s, self.settings.reconnect_max_s)
            delay = next(delays)
            self._set("backoff", f"reconnecting in {delay:g} s")
            self._stop.wait(delay)

    def _open(self) -> Any:
        """The opened container, decoding on ``hwaccel`` when FFmpeg can; when the device is
        missing (FFmpeg answers EPERM or refuses the type) the source decodes in software
        from then on, and says so in its status."""
        import av

        args = open_args(self.settings)
        if not self._hwaccel:
            return av.open(self.settings.url, **args)
        from av.codec.hwaccel import HWAccel

        try:
            accel = HWAccel(device_type=self._hwaccel, allow_software_fallback=True)
            return av.open(self.settings.url, hwaccel=accel, **args)
        except (av.PermissionError, ValueError) as exc:
            self.decoder = f"software ({self._hwaccel} unavailable: {exc})"
            log.warning("stream %s: %s", self.settings.name, self.decoder)
            self._hwaccel = ""
            return av.open(self.settings.url, **args)

    def _read(self, container: Any) -> None:
        """Decode, take one frame per 1/fps, pace a file at its own frame rate."""
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        period = 1.0 / self.settings.fps
        next_take = 0.0
        paced = self.settings.kind == "file"
        first_pts: float | None = None
        started = time.monotonic()
        for frame in container.decode(stream):
            if self._stop.is_set():
                return
            if paced and frame.time is not None:  # a file plays like a camera, not at once
                first_pts = frame.time if first_pts is None else first_pts
                if self._stop.wait(max(0.0, started + frame.time - first_pts - time.monotonic())):
                    return
            self.decoded += 1
            self._heard = time.monotonic()
            now = time.monotonic()
            if now < next_take:
                continue
            next_take = next_take + period if next_take + period > now else now + period
            self._take(frame)

    def _take(self, frame: Any) -> None:
        size = (frame.width, frame.height)
        if size[0] * size[1] > self.settings.max_pixels:
            raise SourceError(
                f"a {size[0]}x{size[1]} frame is over [[stream]] max_pixels "
                f"({self.settings.max_pixels})"
            )
        if size != self.resolution:
            if self.resolution is not None:
                self.resolution_changes += 1
                log.info(
                    "stream %s: resolution %dx%d -> %dx%d",
                    self.settings.name,
                    *self.resolution,
                    *size,
                )
            self.resolution = size
        captured = time.time()
        image = frame.to_image()
        with self._changed:
            self.taken += 1
            self.last_frame_at = captured
            self._changed.notify_all()
        self.slot.put(Frame(image, captured, self.taken))
