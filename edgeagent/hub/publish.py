"""``edgeagent hub publish``: put a signed release (or trust file) on the broker for devices.

A release is verified before it leaves the hub — signatures and threshold against the trust
file devices have (or the one published with it), release format, expiry — because a release
that every device refuses would replace the good one in its retained slot. Group releases
are published retained (QoS 1) on their model's topic, so devices that are offline or join
later receive the current release of every model; single-device releases (rollout waves) are
not retained and reach an offline device through its persistent session. ``hub unpublish``
clears a model's retained slot.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import aiomqtt

from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import ReleaseManifest, parse_manifest
from edgeagent.fleet.mqtt import client_options, connect_properties
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.signing import TrustError, decode_envelope, format_time
from edgeagent.fleet.topics import DeviceTopics, GroupTopics, Topic
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.keys import HubError

MAX_REPORT_BYTES = 256 * 1024  # a device's state report or event is a few KiB


def hub_client(settings: MqttSettings, role: str) -> aiomqtt.Client:
    """A short-lived, clean-session client for one hub command; the broker delivers it no
    message bigger than a report could be (Maximum-Packet-Size)."""
    return aiomqtt.Client(
        **client_options(settings, f"edgeagent-hub-{role}-{secrets.token_hex(4)}"),
        clean_start=True,
        properties=connect_properties(MAX_REPORT_BYTES),
    )


def read_release(
    path: Path, trust: Path | None = None, *, now: datetime | None = None
) -> tuple[bytes, ReleaseManifest]:
    """Load a ``*.release.json`` envelope and its manifest; with ``trust``, refuse it unless a
    device trusting that file would accept it (signatures, format, both expiries)."""
    try:
        envelope = path.read_bytes()
    except OSError as exc:
        raise HubError(f"{path}: cannot read the release ({exc.strerror})") from exc
    try:
        if trust is None:
            return envelope, parse_manifest(
                decode_envelope(envelope, max_bytes=MAX_ENVELOPE_BYTES).payload
            )
        store = TrustStore.load(trust)
        manifest = parse_manifest(store.verify(envelope, "release"))
    except TrustError as exc:
        raise HubError(f"{path}: devices would refuse this release: {exc}") from exc
    moment = now or datetime.now(timezone.utc)
    for what, expires in (("the release", manifest.expires), (str(trust), store.expires)):
        if expires <= moment:
            raise HubError(
                f"{path}: devices would refuse this release: {what} expired at "
                f"{format_time(expires)}"
            )
    return envelope, manifest


def release_topics(
    prefix: str, group: str | None, devices: Sequence[str], model: str
) -> list[Topic]:
    topics = [DeviceTopics(prefix, device).release for device in devices]
    if group:
        topics.insert(0, GroupTopics(prefix, group).release(model))
    if not topics:
        raise HubError("say where to publish: --group GROUP and/or --device ID")
    return topics


async def publish(settings: MqttSettings, topics: Sequence[Topic], envelope: bytes) -> None:
    """Publish with QoS 1 (retained where the topic's kind says so) and wait for each ack."""
    try:
        async with hub_client(settings, "publish") as client:
            for topic in topics:
                await client.publish(topic.name, envelope, qos=1, retain=topic.retained)
    except aiomqtt.MqttError as exc:
        raise HubError(f"broker {settings.host}:{settings.port}: {exc}") from exc


async def clear_release(settings: MqttSettings, group: str, model: str) -> Topic:
    """Remove ``model``'s retained release in ``group`` (an empty retained message deletes it)."""
    topic = GroupTopics(settings.topic_prefix, group).release(model)
    await publish(settings, [topic], b"")
    return topic
