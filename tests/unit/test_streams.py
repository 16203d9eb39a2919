"""The cameras' parts that need no camera: tracker, frame slot, spool, snapshots, discovery."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from PIL import Image

from edgeagent.config import parse_config
from edgeagent.fleet.topics import DeviceTopics
from edgeagent.models.seal_crypto import SealingError
from edgeagent.sections import ConfigError
from edgeagent.streams import discovery
from edgeagent.streams.frames import Frame, FrameSlot
from edgeagent.streams.snapshots import SnapshotStore, open_snapshot
from edgeagent.streams.spool import EventSpool
from edgeagent.streams.tracker import Detection, Tracker, anchor, inside
from tests.support import ha_discovery


def test_a_track_starts_after_min_hits_survives_a_weak_frame_and_ends_after_max_missed() -> None:
    tracker = Tracker(iou_threshold=0.3, min_hits=2, max_missed=1)
    person = Detection("person", 0.9, (10, 10, 50, 90))
    assert tracker.update([person], high=0.5).started == []
    started = tracker.update([Detection("person", 0.8, (12, 10, 52, 90))], 0.5).started
    assert [t.label for t in started] == ["person"]
    # A score dip below the threshold keeps the track (ByteTrack's second association).
    weak = tracker.update([Detection("person", 0.3, (14, 10, 54, 90))], 0.5)
    assert [t.id for t in weak.seen] == [started[0].id] and not weak.started
    # Another label in the same place is another object.
    cat = tracker.update([Detection("cat", 0.9, (14, 10, 54, 90))], 0.5)
    assert cat.started == [] and cat.ended == []
    assert [t.id for t in tracker.update([], 0.5).ended] == [started[0].id]


def test_zones_and_masks_are_polygons_in_frame_fractions() -> None:
    square = [[0.0, 0.5], [0.5, 0.5], [0.5, 1.0], [0.0, 1.0]]
    assert inside(anchor((10, 10, 90, 190), (400, 200)), square)  # bottom centre (0.125, 0.95)
    assert not inside(anchor((300, 10, 390, 190), (400, 200)), square)


def test_the_frame_slot_drops_the_oldest_frame_first() -> None:
    async def run() -> list[int]:
        slot = FrameSlot(2, asyncio.get_running_loop())
        image = Image.new("RGB", (4, 4))
        for seq in range(1, 6):
            slot.put(Frame(image, 0.0, seq))
        assert slot.dropped == 3
        return [(await slot.get()).seq, (await slot.get()).seq]

    assert asyncio.run(run()) == [4, 5]


def test_the_spool_is_bounded_survives_a_reopen_and_removes_only_what_was_sent(
    tmp_path: Path,
) -> None:
    spool = EventSpool(tmp_path, max_events=3, max_bytes=1 << 20)
    for n in range(5):
        spool.append("t/events", {"n": n})
    assert spool.status() | {"bytes": 0} == {"pending": 3, "bytes": 0, "dropped": 2}
    reopened = EventSpool(tmp_path, max_events=3, max_bytes=1 << 20)
    oldest = reopened.oldest()
    assert oldest is not None and oldest[1] == "t/events" and b'"n": 2' in oldest[2]
    reopened.remove(oldest[0])
    reopened.append("t/events", {"n": 5})
    after = EventSpool(tmp_path, max_events=3, max_bytes=1 << 20)
    assert len(after) == 3 and after.oldest() is not None
    assert after.oldest()[2] == b'{"n": 3}'  # type: ignore[index]


def test_snapshots_are_sealed_to_the_device_key_and_kept_within_budget(tmp_path: Path) -> None:
    device = X25519PrivateKey.generate()
    store = SnapshotStore(tmp_path, 10_000_000, 3600, 80, lambda: device.public_key())
    image = Image.new("RGB", (64, 48), (200, 30, 30))
    name = store.save("door-1", image, sealed=True)
    assert name == "door-1.jpg.sealed"
    sealed = (tmp_path / name).read_bytes()
    assert b"JFIF" not in sealed
    assert Image.open(io.BytesIO(open_snapshot(tmp_path / name, device))).size == (64, 48)
    with pytest.raises(SealingError):
        open_snapshot(tmp_path / name, X25519PrivateKey.generate())
    plain = store.save("door-2", image, sealed=False)
    assert plain is not None and (tmp_path / plain).read_bytes().startswith(b"\xff\xd8")
    tight = SnapshotStore(tmp_path, len(sealed) + 10, 3600, 80)  # room for one more file
    tight.save("door-3", image, sealed=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["door-3.jpg"]


def test_home_assistant_accepts_the_discovery_configs_and_refuses_broken_ones() -> None:
    topics = DeviceTopics("edgeagent", "cam.host-1")
    presence_topic, presence = discovery.presence_config("homeassistant", topics, "door")
    count_topic, count = discovery.count_config("homeassistant", topics, "door", "car")
    assert ha_discovery.validate("binary_sensor", presence)["device_class"] == "occupancy"
    assert ha_discovery.validate("sensor", count)["state_class"] == "measurement"
    assert presence_topic.retained and presence_topic.name == (
        "homeassistant/binary_sensor/cam_host-1/edgeagent_cam_host-1_door_person_present/config"
    )
    assert count["state_topic"] == "edgeagent/device/cam.host-1/stream/door/count/car"
    assert count_topic.name.startswith("homeassistant/sensor/cam_host-1/")
    # The check can fail: what HA refuses, it refuses.
    for component, broken in (
        ("binary_sensor", presence | {"device_class": "person"}),
        ("sensor", {k: v for k, v in count.items() if k != "state_topic"}),
        ("sensor", count | {"state_topic": "a/#/b"}),
        ("sensor", count | {"device": {"name": "no identifiers"}}),
        ("binary_sensor", presence | {"availabilty_topic": "typo"}),
    ):
        with pytest.raises(ha_discovery.Invalid):
            ha_discovery.validate(component, broken)


def test_stream_tables_are_validated_and_names_unique() -> None:
    config = parse_config(
        '[[stream]]\nname = "door"\nurl = "rtsp://10.0.0.2/live"\nrtsp_transport = "udp"\n'
        "zones = { porch = [[0, 0], [1, 0], [1, 1]] }\n"
        '[[stream]]\nname = "desk"\nurl = "/dev/video0"\n'
    )
    assert [(c.name, c.kind) for c in config.cameras] == [("door", "rtsp"), ("desk", "v4l2")]
    with pytest.raises(ConfigError) as raised:
        parse_config(
            '[[stream]]\nname = "door"\nurl = "a.mp4"\nzones = { porch = [[0, 0], [2, 0]] }\n'
            '[[stream]]\nname = "door"\nurl = "b.mp4"\nfps = 0\n'
        )
    text = str(raised.value)
    assert "zone 'porch'" in text and "[stream] fps: stream door" in text
    with pytest.raises(ConfigError, match="door used twice"):
        parse_config('[[stream]]\nname = "door"\nurl = "a"\n[[stream]]\nname = "door"\nurl = "b"\n')


def test_a_reload_restarts_only_the_streams_whose_table_changed(tmp_path: Path) -> None:
    from edgeagent.streams.service import StreamsService
    from edgeagent.streams.settings import StreamSettings, StreamsSettings

    def stream(name: str, **keys: object) -> StreamSettings:
        # A file that does not exist: the source fails and backs off, no frame is ever decoded.
        return StreamSettings(name=name, url=str(tmp_path / f"{name}.mp4"), **keys)  # type: ignore[arg-type]

    async def run() -> None:
        service = StreamsService(
            StreamsSettings(),
            (stream("a"), stream("b")),
            detector=None,  # type: ignore[arg-type]  # never reached: no frame decodes
            topics=DeviceTopics("edgeagent", "dev"),
            link=None,
            state_dir=tmp_path,
        )
        await service.start()
        first = dict(service.pipelines)
        await service.apply((stream("a"), stream("b", fps=2.0), stream("c")))
        assert service.pipelines["a"] is first["a"]  # unchanged: kept running
        assert service.pipelines["b"] is not first["b"] and service.pipelines["b"].settings.fps == 2
        assert sorted(service.status()["streams"]) == ["a", "b", "c"]
        await service.apply(())
        assert service.status()["streams"] == {}
        await service.stop()

    asyncio.run(run())


def test_a_sealed_detector_seals_its_snapshots() -> None:
    import dataclasses

    from edgeagent.models.package import load_package
    from edgeagent.streams.pipeline import sealed
    from tests.support.helpers import REPO

    package = load_package(REPO / "zoo" / "coco_ssd")
    assert not sealed(package)
    variant = dataclasses.replace(package.variants[0], sealed_files=(Path("model.onnx.sealed"),))
    assert sealed(dataclasses.replace(package, variants=(variant,)))


def test_labels_and_masks_decide_what_the_tracker_sees() -> None:
    from edgeagent.streams.pipeline import wanted
    from edgeagent.streams.settings import StreamSettings

    found = [
        {"label": "person", "score": 0.9, "box": [10, 10, 90, 190]},  # stands at (0.125, 0.95)
        {"label": "person", "score": 0.8, "box": [300, 10, 390, 190]},  # stands at (0.86, 0.95)
        {"label": "car", "score": 0.7, "box": [300, 10, 390, 190]},
    ]
    right_half = [[0.5, 0.0], [1.0, 0.0], [1.0, 1.0], [0.5, 1.0]]
    everything = StreamSettings(name="a", url="x")
    assert len(wanted(found, everything, (400, 200))) == 3
    masked = StreamSettings(name="a", url="x", labels=["person"], masks=[right_half])
    assert [(d.label, d.box) for d in wanted(found, masked, (400, 200))] == [
        ("person", (10, 10, 90, 190))
    ]
