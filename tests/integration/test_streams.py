"""Cameras end to end against software we did not write: GStreamer's RTSP server streaming
H.264 made by ffmpeg from real photos, a real Mosquitto, PyAV/FFmpeg decoding, the agent as a
process, and Home Assistant's discovery rules.

One agent serves two cameras on the same RTSP server: ``door`` over TCP (tracked, events)
and ``lobby`` over UDP with a frame-age limit no frame can meet (so it shows stale frames are
counted, never processed). The camera is killed and restarted mid-stream while the broker is
down; the events of that time wait in the spool and each arrives once when the broker is back.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.agent_process import Agent
from devtools.broker import Broker
from devtools.camera_video import make_video
from devtools.cameras import RtspCamera, Subscriber, rtsp_available
from tests.support import ha_discovery
from tests.support.helpers import REPO

pytestmark = pytest.mark.skipif(rtsp_available() is not None, reason=str(rtsp_available()))
# A person (the astronaut), nothing (the rocket), a person again (Grace Hopper): a track
# starts and ends within each pass through the file.
PHOTOS = ["astronaut.png", "rocket.jpg", "grace_hopper.jpg", "rocket.jpg"]


def poll(what: str, check: Any, timeout: float = 30.0) -> Any:
    """``check()`` until truthy (the agent's status is the only view of its spool)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def camera_config(tmp_path: Path, broker: Broker, camera: RtspCamera, cameras: bool) -> Path:
    streams = f'''
[[stream]]
name = "door"
url = "{camera.url}"
labels = ["person"]
zones = {{ left = [[0, 0], [0.6, 0], [0.6, 1], [0, 1]] }}
classifier = "mobilenet_v2"
min_hits = 2
max_missed = 2
read_timeout_s = 2
reconnect_min_s = 0.2
reconnect_max_s = 1

[[stream]]
name = "lobby"
url = "{camera.url}"
rtsp_transport = "udp"
max_frame_age_s = 0.000001
snapshots = false
read_timeout_s = 2
reconnect_min_s = 0.2
reconnect_max_s = 1
'''
    config = tmp_path / "agent.toml"
    config.write_text(
        '[server]\nplan = "fixed"\n'  # no plan search competing with the cameras for CPU
        f'[agent]\nmodels_dir = "{REPO / "zoo"}"\nmodels = ["coco_ssd", "mobilenet_v2"]\n'
        'device_id = "cam-box"\n'
        f"[mqtt]\nport = {broker.port}\nreconnect_min_s = 0.2\nreconnect_max_s = 1.0\n"
        f"connect_timeout_s = 3\n" + (streams if cameras else "")
    )
    return config


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Broker, RtspCamera, Subscriber, Agent]]:
    video = make_video(tmp_path / "camera.mp4", PHOTOS, seconds=1.6)
    broker = Broker(tmp_path / "broker")
    broker.start()
    camera = RtspCamera(video).start()
    subscriber = Subscriber(broker.port, "#")
    agent = Agent(tmp_path, camera_config(tmp_path, broker, camera, cameras=True))
    try:
        yield broker, camera, subscriber, agent
    finally:
        subscriber.close()
        camera.kill()
        assert agent.stop() == 0
        broker.stop()


def test_camera_events_reach_home_assistant_and_survive_a_camera_and_a_broker_restart(
    setup: tuple[Broker, RtspCamera, Subscriber, Agent], tmp_path: Path
) -> None:
    broker, camera, subscriber, agent = setup
    prefix = "edgeagent/device/cam-box/stream/door"
    subscriber.wait(
        "a person's start event",
        lambda: any(e["type"] == "start" and e["label"] == "person" for e in subscriber.events()),
    )
    start = next(e for e in subscriber.events() if e["label"] == "person")
    assert start["stream"] == "door" and len(start["box"]) == 4 and start["score"] >= 0.5
    assert start["captured_at"] <= start["emitted_at"]
    assert start["zones"] == ["left"]  # the person stands in the frame's left 60 %
    assert start["sub_label"] and 0 <= start["sub_label_score"] <= 1  # the crop's classifier
    snapshots = tmp_path / "state" / "edgeagent" / "streams" / "snapshots"
    assert (snapshots / start["snapshot"]).read_bytes()[:2] == b"\xff\xd8"  # a JPEG

    # Home Assistant discovery: retained, and valid by HA's schema.
    presence_config = "homeassistant/binary_sensor/cam-box/edgeagent_cam-box_door_person_present"
    subscriber.wait("discovery configs", lambda: subscriber.last(presence_config + "/config"))
    configs = [(t, p) for t, p, _ in subscriber.messages if t.startswith("homeassistant/")]
    assert {t.split("/")[1] for t, _ in configs} == {"binary_sensor", "sensor"}
    for topic, payload in configs:
        ha_discovery.validate(topic.split("/")[1], json.loads(payload))
    presence = json.loads(subscriber.last(presence_config + "/config") or b"{}")
    assert presence["state_topic"] == f"{prefix}/presence/person"
    subscriber.wait("presence ON", lambda: subscriber.last(f"{prefix}/presence/person") == b"ON")

    status = agent.client.status()["streams"]["streams"]
    assert status["door"]["state"] == "streaming" and status["door"]["frames_processed"] > 0
    lobby = poll("lobby's frames", lambda: agent.client.status()["streams"]["streams"]["lobby"])
    poll("UDP frames", lambda: agent.client.status()["streams"]["streams"]["lobby"]["frames_taken"])
    lobby = agent.client.status()["streams"]["streams"]["lobby"]
    assert lobby["frames_stale"] > 0 and lobby["frames_processed"] == 0

    # The broker goes away; then the camera dies mid-stream and comes back.
    broker.stop()
    camera.kill()
    agent.wait_for("stream door: streaming -> ")  # closed, stalled or failed: the kill
    camera.start()
    agent.wait_for("stream door: connecting -> streaming")
    poll(
        "events spooled while the broker is away",
        lambda: agent.client.status()["streams"]["events"]["pending"] >= 2,
    )
    broker.start()
    # The cameras are removed by a reload: every live track ends, then nothing more is made.
    camera_config(tmp_path, broker, camera, cameras=False)
    agent.hup_and_wait_for("stream lobby stopped")
    outbox = poll(
        "the spool drained",
        lambda: (e := agent.client.status()["streams"]["events"])["pending"] == 0 and e,
    )
    assert outbox["dropped"] == 0 and outbox["delivered"] == outbox["spooled"]
    subscriber.wait("every event", lambda: len(subscriber.events()) >= outbox["spooled"])
    events = subscriber.events()
    ids = Counter(e["id"] for e in events)
    assert len(events) == outbox["spooled"] and max(ids.values()) == 1  # 0 lost, each once
    assert {e["label"] for e in events} == {"person"}  # labels = ["person"]
    kinds = Counter((e["track_id"], e["type"]) for e in events if e["type"] != "update")
    assert all(kinds[(track, "end")] == 1 for track, kind in kinds if kind == "start")
    assert agent.client.status()["streams"]["streams"] == {}
