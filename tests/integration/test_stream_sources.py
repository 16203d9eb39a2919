"""Sources that misbehave, decoded by PyAV/FFmpeg from files ffmpeg made of real photos: a
camera that changes resolution, a recording cut short, bytes that are no video at all."""

from __future__ import annotations

import asyncio
import io
import random
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from devtools.camera_video import PHOTOS, join_videos, make_video
from devtools.cameras import RtspCamera, rtsp_available
from edgeagent.streams.frames import FrameSlot
from edgeagent.streams.settings import StreamSettings
from edgeagent.streams.source import Source

pytestmark = pytest.mark.skipif(rtsp_available() is not None, reason=str(rtsp_available()))
ENDED: Callable[[Source], bool] = lambda s: s.state == "ended"  # noqa: E731
BASE = StreamSettings(name="file", url="", loop=False, frame_slots=64, fps=10, read_timeout_s=2)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()  # the slot's consumer loop; the frames are read directly
    yield loop
    loop.close()


def run(
    settings: StreamSettings, loop: asyncio.AbstractEventLoop, until: Callable[[Source], bool]
) -> Source:
    """Run a source until ``until(source)`` holds after a state change, then stop it."""
    source = Source(settings, FrameSlot(settings.frame_slots, loop))
    source.start()
    try:
        assert source.wait_until(until, 30), source.status()
    finally:
        source.stop()
    return source


def test_a_camera_that_changes_resolution_keeps_streaming(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    small = make_video(tmp_path / "a.ts", ["astronaut.png"], width=320, height=240, seconds=1)
    large = make_video(tmp_path / "b.ts", ["chelsea.png"], width=640, height=360, seconds=1)
    video = join_videos(tmp_path / "joined.ts", [small, large])
    source = run(replace(BASE, url=str(video)), loop, ENDED)
    sizes = [frame.image.size for frame in source.slot._frames]
    assert sizes[0] == (320, 240) and sizes[-1] == (640, 360)
    assert source.resolution_changes == 1 and source.resolution == (640, 360)
    # Sampled at 10 fps from a 5 fps file: every frame; at 2.5 fps: about one in two. Asked
    # to decode on CUDA, it does where there is a GPU and falls back to software where not.
    halved = run(replace(BASE, url=str(video), fps=2.5, hwaccel="cuda"), loop, ENDED)
    assert 0 < halved.taken < halved.decoded == source.decoded
    assert halved.decoder == "hardware (cuda)" or halved.decoder.startswith(
        "software (cuda unavailable"
    )


def test_a_recording_cut_short_yields_its_frames_then_ends_or_fails_cleanly(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    video = make_video(
        tmp_path / "cut.mp4", ["astronaut.png", "chelsea.png"], seconds=1,
        extra=["-movflags", "+faststart"],
    )  # fmt: skip
    data = video.read_bytes()
    video.write_bytes(data[: len(data) * 6 // 10])
    source = run(replace(BASE, url=str(video)), loop, lambda s: s.state in ("ended", "backoff"))
    assert source.taken > 0


def test_bytes_that_are_no_video_fail_and_are_retried_with_back_off(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    garbage = tmp_path / "garbage.mp4"
    # Fixed bytes: fresh random ones now and then probe as some container (MPEG-TS or MP3 sync
    # bytes turn up by chance), and that source then streams (it failed a full run so).
    garbage.write_bytes(random.Random(0).randbytes(64 * 1024))
    settings = replace(BASE, url=str(garbage), reconnect_min_s=0.05, reconnect_max_s=0.2)
    source = run(settings, loop, lambda s: [h[1] for h in s.history].count("backoff") >= 3)
    states = [state for _, state, _ in source.history]
    assert source.taken == 0 and states[:4] == ["connecting", "failed", "backoff", "connecting"]
    delays = [why for _, state, why in source.history if state == "backoff"]
    assert delays[:3] == [f"reconnecting in {d} s" for d in ("0.05", "0.1", "0.2")]


class MjpegCamera(ThreadingHTTPServer):
    """An HTTP MJPEG camera (multipart/x-mixed-replace, as IP cameras send it): ``frames``
    JPEGs of a real photo per connection, then the connection closes (a camera reboot)."""

    def __init__(self, frames: int) -> None:
        photo = Image.open(PHOTOS / "chelsea.png").convert("RGB")
        buffer = io.BytesIO()
        photo.save(buffer, format="JPEG")
        jpeg = buffer.getvalue()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                for _ in range(frames):
                    self.wfile.write(
                        b"--frame\r\nContent-Type: image/jpeg\r\n"
                        + f"Content-Length: {len(jpeg)}\r\n\r\n".encode()
                        + jpeg
                        + b"\r\n"
                    )
                    self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.size = photo.size
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_an_mjpeg_camera_is_decoded_and_reconnected_when_it_closes(
    loop: asyncio.AbstractEventLoop,
) -> None:
    camera = MjpegCamera(frames=8)
    try:
        url = f"http://127.0.0.1:{camera.server_address[1]}/video"
        settings = replace(BASE, name="mjpeg", url=url, fps=60, reconnect_min_s=0.05)
        source = run(settings, loop, lambda s: s.connects >= 2 and s.state == "streaming")
    finally:
        camera.shutdown()
        camera.server_close()
    assert source.taken >= 1 and source.resolution == camera.size
    states = [state for _, state, _ in source.history]
    # The connection's end reads as an I/O error from FFmpeg's HTTP input: failed, then back-off.
    assert states[:5] == ["connecting", "streaming", "failed", "backoff", "connecting"]


def test_a_frozen_rtsp_camera_is_noticed_as_stalled_and_reconnected(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    video = make_video(tmp_path / "cam.mp4", ["astronaut.png", "rocket.jpg"] * 4, seconds=1)
    camera = RtspCamera(video).start()
    assert camera.process is not None
    settings = replace(
        BASE, name="rtsp", url=camera.url, read_timeout_s=1, reconnect_min_s=0.1, frame_slots=1
    )
    source = Source(settings, FrameSlot(1, loop))
    source.start()
    try:
        assert source.wait_until(lambda s: s.state == "streaming" and s.taken > 0, 30)
        camera.process.send_signal(signal.SIGSTOP)  # the camera freezes: the socket stays open
        assert source.wait_until(lambda s: s.state == "stalled", 30), source.status()
        camera.process.send_signal(signal.SIGCONT)
        assert source.wait_until(lambda s: s.connects >= 2 and s.state == "streaming", 30)
    finally:
        source.stop()
        camera.kill()
    assert "nothing received for 1 s" in [why for _, state, why in source.history]
