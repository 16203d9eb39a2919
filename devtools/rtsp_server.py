"""A real RTSP server on loopback for the camera tests and bench: GStreamer's gst-rtsp-server
serving an H.264 file (MP4 or Matroska) at rtsp://127.0.0.1:<port>/cam.

Run with the *system* python3 (Debian's python3-gi with gir1.2-gst-rtsp-server-1.0; the
project's venv has no GObject bindings)::

    /usr/bin/python3 devtools/rtsp_server.py VIDEO.mp4 --port 8554

It prints "ready rtsp://127.0.0.1:<port>/cam" once it listens. Each client gets its own
pipeline (not shared), played in real time; at the end of the file the session ends, as a
camera's does when it reboots (the agent reconnects). SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def factory(path: str) -> GstRtspServer.RTSPMediaFactory:
    """A media factory: each client its own pipeline over the file, in real time."""
    demux = "matroskademux" if path.endswith(".mkv") else "qtdemux"
    media = GstRtspServer.RTSPMediaFactory()
    media.set_launch(
        f'( filesrc location="{path}" ! {demux} ! h264parse config-interval=-1 '
        "! rtph264pay name=pay0 pt=96 config-interval=1 )"
    )
    media.set_shared(False)
    return media


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("video")
    parser.add_argument("--port", type=int, default=8554)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address(args.host)
    server.set_service(str(args.port))
    server.get_mount_points().add_factory("/cam", factory(args.video))
    if server.attach(None) == 0:
        print(f"cannot listen on {args.host}:{args.port}", file=sys.stderr, flush=True)
        return 1
    loop = GLib.MainLoop()
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, loop.quit)
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGINT, loop.quit)
    print(f"ready rtsp://{args.host}:{args.port}/cam", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
