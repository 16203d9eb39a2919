"""A real RTSP camera (GStreamer's gst-rtsp-server, run by the system python3) and an MQTT
subscriber (paho, a persistent session) for the camera tests and bench."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from devtools.ports import free_port

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"


def rtsp_available() -> str | None:
    """Why the RTSP server cannot run here (None: it can)."""
    if shutil.which("ffmpeg") is None:
        return "ffmpeg is not installed (apt-get install ffmpeg)"
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import gi; gi.require_version('GstRtspServer', '1.0')"],
        capture_output=True,
    )
    if probe.returncode != 0:
        return "gst-rtsp-server is not installed (apt-get install gir1.2-gst-rtsp-server-1.0)"
    return None


class RtspCamera:
    """devtools/rtsp_server.py serving ``video``; stop() and start() keep the port."""

    def __init__(self, video: Path, port: int | None = None) -> None:
        self.video = video
        self.port = port or free_port()
        self.url = f"rtsp://127.0.0.1:{self.port}/cam"
        self.process: subprocess.Popen | None = None

    def start(self) -> RtspCamera:
        self.process = subprocess.Popen(
            [SYSTEM_PYTHON, str(REPO / "devtools" / "rtsp_server.py"), str(self.video),
             "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("ready"), line + self.process.stdout.read()
        return self

    def kill(self) -> None:
        """The camera dies at once (SIGKILL: no RTSP TEARDOWN reaches the client)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


class Subscriber:
    """A paho client on its own thread recording every message; a persistent session, so
    what is published while it reconnects after a broker restart is still delivered."""

    def __init__(self, port: int, topic: str, client_id: str = "test-subscriber") -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self._changed = threading.Condition()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.reconnect_delay_set(0.2, 1)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", port, clean_start=False, properties=properties)
        self.client.loop_start()

    def _on_message(self, _client: Any, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._changed:
            self.messages.append((message.topic, message.payload, bool(message.retain)))
            self._changed.notify_all()

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 60) -> None:
        with self._changed:
            if not self._changed.wait_for(predicate, timeout):
                raise AssertionError(f"no {what} within {timeout:g} s; got {self.topics()}")

    def events(self) -> list[dict]:
        with self._changed:
            return [json.loads(p) for t, p, _ in self.messages if t.endswith("/events")]

    def last(self, topic: str) -> bytes | None:
        with self._changed:
            found = [p for t, p, _ in self.messages if t == topic]
        return found[-1] if found else None

    def topics(self) -> list[str]:
        return sorted({t for t, _, _ in self.messages})

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
