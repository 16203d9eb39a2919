"""The update path over a real Mosquitto with the in-process device stack: a device offline
during the publish, a broker restart in the middle of a download, an HTTP server that drops
the connection (the download resumes with Range), and a staged rollout that aborts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.commands.hub.publish import trust_message
from edgeagent.fleet.manifest import parse_manifest
from edgeagent.fleet.signing import decode_envelope
from edgeagent.fleet.topics import DeviceTopics, GroupTopics
from edgeagent.hub.keys import generate_key, rotate
from edgeagent.hub.policy import StagedPolicy
from edgeagent.hub.publish import hub_client, publish
from edgeagent.hub.rollout import rollout
from edgeagent.hub.serve import artifact_response
from edgeagent.hub.status import collect_fleet
from tests.integration.test_updates_helpers import (
    Hub,
    break_model,
    hub_fixture,  # noqa: F401 - fixture
    stacks_fixture,  # noqa: F401 - fixture
)

pytestmark = pytest.mark.broker


class ArtifactServer:
    """Serves hub.artifacts with a chosen misbehaviour; records the Range headers it saw."""

    def __init__(self, directory: Path, *, chunk_delay: float = 0.0, drop_first: bool = False):
        self.directory = directory
        self.chunk_delay = chunk_delay
        self.drop_first = drop_first
        self.ranges: list[str | None] = []
        self.started_sending = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = self.directory / request.match_info["name"]
        self.ranges.append(request.headers.get("Range"))
        if self.drop_first and len(self.ranges) == 1:
            response = web.StreamResponse(headers={"Content-Length": str(path.stat().st_size)})
            await response.prepare(request)
            await response.write(path.read_bytes()[:1500])
            assert request.transport is not None
            request.transport.close()
            return response
        if self.chunk_delay:
            data = path.read_bytes()
            response = web.StreamResponse(headers={"Content-Length": str(len(data))})
            await response.prepare(request)
            for start in range(0, len(data), 512):
                self.started_sending.set()
                await response.write(data[start : start + 512])
                await asyncio.sleep(self.chunk_delay)
            return response
        return await artifact_response(request, path)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/{name}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@contextlib.asynccontextmanager
async def serving(hub: Hub, **behaviour) -> AsyncIterator[ArtifactServer]:
    server = ArtifactServer(hub.artifacts, **behaviour)
    original, hub.url = hub.url, await server.start()
    try:
        yield server
    finally:
        hub.url = original
        await server.stop()


async def test_a_device_offline_during_the_publish_installs_on_reconnect(
    stacks, hub: Hub, broker: Broker
) -> None:
    online = await (await stacks()).start()
    await online.stop()  # offline, but its persistent session stays on the broker
    envelope = hub.release("1")
    await publish(broker.settings(), [DeviceTopics("edgeagent", "dev-1").release], envelope)

    online = await (await stacks(state="dev-1")).start()
    await until(lambda: online.outcome() is not None)
    assert online.outcome()["result"] == "succeeded"
    assert online.device.serving() == "1"


async def test_a_broker_restart_in_the_middle_of_a_download(stacks, hub: Hub, broker: Broker):
    online = await (await stacks()).start()
    async with serving(hub, chunk_delay=0.05) as server:
        envelope = hub.release("1")
        await publish(
            broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], envelope
        )
        await asyncio.wait_for(server.started_sending.wait(), 15)
        await asyncio.to_thread(broker.restart)
        await until(lambda: online.outcome() is not None, timeout=60)
    assert online.outcome()["result"] == "succeeded", online.outcome()
    assert online.link.connections >= 2
    await until(lambda: online.link.connected.is_set())
    rows = await collect_fleet(broker.settings(), group="lab", wait_s=0.5)
    assert rows[0]["last_result"] == "succeeded" and rows[0]["models"] == {"tiny": "1"}


async def test_a_dropped_http_connection_resumes_with_range(stacks, hub: Hub, broker: Broker):
    online = await (await stacks()).start()
    async with serving(hub, drop_first=True) as server:
        await publish(
            broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], hub.release("1")
        )
        await until(lambda: online.outcome() is not None, timeout=30)
    assert online.outcome()["result"] == "succeeded", online.outcome()
    assert server.ranges[0] is None and server.ranges[1] is not None
    assert server.ranges[1].startswith("bytes=") and server.ranges[1] != "bytes=0-"


async def test_a_staged_rollout_aborts_when_too_many_devices_fail(stacks, hub: Hub, broker):
    fleet = [await (await stacks(f"dev-{i}")).start() for i in range(4)]
    for online in fleet:  # every device serves v1, through the group's retained release
        online.device.updater.reporter.refresh()
    await publish(
        broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], hub.release("1")
    )
    await until(lambda: all(o.outcome() for o in fleet), timeout=60)

    envelope = hub.sign(break_model(hub.package("2")))
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=1 << 16).payload)
    policy = StagedPolicy((25.0, 50.0, 100.0), abort_threshold_pct=50.0, stage_timeout_s=30)
    report = await rollout(
        broker.settings(), manifest, sign=hub.signer(), group="lab", policy=policy
    )
    assert report.aborted and report.outcomes == {"dev-0": "failed"}, report.to_dict()
    assert report.codes == {"dev-0": "load_failed"}
    assert [o.device.serving() for o in fleet] == ["1", "1", "1", "1"]
    assert all(o.outcome()["version"] == "1" for o in fleet[1:])  # never received v2


async def test_an_aborted_rollout_is_cancelled_on_a_device_that_was_offline(
    stacks, hub: Hub, broker: Broker
) -> None:
    """``hub rollout``: the device is offline, times out, the rollout aborts and sends it a
    cancellation behind the release; back online it gets both and installs nothing."""
    (hub.keys / "serials.json").write_text('{"tiny": 9}')  # a hub that has released before
    first = await (await stacks("dev-0", state="dev-0")).start()
    assert (await first.device.apply(hub.release("1")))["result"] == "succeeded"
    await first.stop()  # its session stays on the broker

    manifest = parse_manifest(decode_envelope(hub.release("2"), max_bytes=1 << 16).payload)
    signer = hub.signer()
    policy = StagedPolicy((100.0,), abort_threshold_pct=50.0, stage_timeout_s=1)
    report = await rollout(
        broker.settings(),
        manifest,
        sign=signer,
        cancel=signer.cancellation,
        group="lab",
        policy=policy,
        devices=["dev-0"],
    )
    assert report.aborted and report.outcomes == {"dev-0": "timed_out"}, report.to_dict()
    assert report.cancelled == ["dev-0"]

    back = await (await stacks("dev-0", state="dev-0")).start()
    await until(lambda: (back.outcome() or {}).get("version") == "2", timeout=60)
    outcome = back.outcome()
    assert outcome is not None and (outcome["result"], outcome["code"]) == ("refused", "cancelled")
    assert outcome["deployment_id"] == manifest.deployment_id
    assert back.device.store.current("tiny") == "1" and back.device.store.versions("tiny") == ["1"]


async def test_a_staged_rollout_completes_in_stages(stacks, hub: Hub, broker: Broker):
    fleet = [await (await stacks(f"dev-{i}")).start() for i in range(3)]
    for online in fleet:
        online.device.updater.reporter.refresh()
    envelope = hub.release("1")
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=1 << 16).payload)
    policy = StagedPolicy((34.0, 100.0), stage_timeout_s=30)
    report = await rollout(
        broker.settings(), manifest, sign=hub.signer(), group="lab", policy=policy
    )
    assert not report.aborted and set(report.outcomes.values()) == {"succeeded"}
    assert [len(s["devices"]) for s in report.stages] == [2, 1]
    assert [o.device.serving() for o in fleet] == ["1", "1", "1"]


async def test_a_rotated_trust_file_over_mqtt_retires_the_old_release_key(
    stacks, hub: Hub, broker: Broker
) -> None:
    online = await (await stacks()).start()
    new_key = generate_key(hub.keys, "release-2")
    rotated = rotate(
        hub.keys / "trust.json",
        old_root_keys=[hub.keys / "root.key"],
        release_pubs=[new_key.pub_path],
        out_path=hub.root / "trust-v2.json",
    )
    await publish(broker.settings(), [GroupTopics("edgeagent", "lab").trust], rotated.read_bytes())
    await until(lambda: online.device.updater.trust.version == 2)
    assert online.outcome()["code"] == "rotated"

    refused = await online.device.apply(hub.release("1"))  # signed with the retired key
    assert (refused["result"], refused["code"]) == ("refused", "unknown_key")
    accepted = await online.device.apply(
        hub.release("1", key_paths=[new_key.key_path], deployment_id="tiny-1-new-key")
    )
    assert accepted["result"] == "succeeded", accepted


async def test_a_device_that_slept_through_two_rotations_catches_up(
    stacks, hub: Hub, broker: Broker
) -> None:
    """The hub publishes every archived rotation; the device walks v1 → v2 → v3 from one message."""
    online = await (await stacks()).start()
    generate_key(hub.keys, "root-2")
    rotate(
        hub.keys / "trust.json",
        old_root_keys=[hub.keys / "root.key"],
        new_root_keys=[hub.keys / "root-2.key"],
    )
    new_key = generate_key(hub.keys, "release-3")
    rotate(
        hub.keys / "trust.json",
        old_root_keys=[hub.keys / "root-2.key"],
        release_pubs=[new_key.pub_path],
    )
    message = trust_message(hub.keys / "trust.json")  # what 'hub publish --trust-file' sends
    await publish(broker.settings(), [GroupTopics("edgeagent", "lab").trust], message)
    await until(lambda: online.device.updater.trust.version == 3)
    accepted = await online.device.apply(
        hub.release("1", key_paths=[new_key.key_path], deployment_id="tiny-1-v3-key")
    )
    assert accepted["result"] == "succeeded", accepted


async def test_a_stage_envelope_replayed_on_the_group_topic_is_wrong_target(
    stacks, hub: Hub, broker: Broker
) -> None:
    """Issue 10 item 8: each stage is signed for its own devices, so a device outside the
    stage that sees the copy (here replayed on the group topic) refuses it."""
    inside = await (await stacks("dev-0")).start()
    outside = await (await stacks("dev-1")).start()
    envelope = hub.release("1")
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=1 << 16).payload)
    async with hub_client(broker.settings(), "spy") as spy:
        await spy.subscribe(DeviceTopics("edgeagent", "dev-0").release.name, qos=1)
        report = await rollout(
            broker.settings(),
            manifest,
            sign=hub.signer(),
            group="lab",
            policy=StagedPolicy((100.0,), stage_timeout_s=30),
            devices=["dev-0"],
        )
        stage_envelope = bytes((await anext(aiter(spy.messages))).payload)  # type: ignore[arg-type]
    assert report.outcomes == {"dev-0": "succeeded"} and inside.device.serving() == "1"

    await publish(
        broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], stage_envelope
    )
    await until(lambda: outside.outcome() is not None, timeout=30)
    assert (outside.outcome()["result"], outside.outcome()["code"]) == ("refused", "wrong_target")
    assert outside.device.store.current("tiny") is None


async def test_a_release_copied_onto_the_trust_topic_still_installs(
    stacks, hub: Hub, broker: Broker
) -> None:
    """Issue 10 item 2 over a real broker: the copy on the trust topic is refused, and the
    same bytes on the release topic install (before: silently ignored as "already handled")."""
    online = await (await stacks()).start()
    envelope = hub.release("1")
    group = GroupTopics("edgeagent", "lab")
    await publish(broker.settings(), [group.trust], envelope)
    await until(lambda: any(e.get("code") == "unknown_key" for e in online.device.events))
    await publish(broker.settings(), [group.release("tiny")], envelope)
    await until(lambda: online.outcome() is not None, timeout=30)
    assert online.outcome()["result"] == "succeeded", online.outcome()
    assert online.device.serving() == "1"
