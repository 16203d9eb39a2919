"""``edgeagent hub publish``: put a signed release (or trust file) on the broker for devices.

A release is verified before it leaves the hub — signatures and threshold against the trust
file devices have (or the one published with it), release format, validity window
(``hub.release_checks``: the devices' own checks) — because a release that every device
refuses would replace the good one in its retained slot. Group releases are published
retained (QoS 1) on their model's topic, so devices that are offline or join later receive the
current release of every model; single-device releases (rollout waves) are not retained and
reach an offline device through its persistent session. ``hub unpublish`` clears a model's
retained slot.

A retained slot is read before it is replaced: a release whose serial is not above the one
retained there is refused, because the slot is what a device that starts later installs — a
replayed older envelope there (say, after a rollback) would put it on the version the fleet
just left. There is no ``--force``: a new release is signed with a fresh serial (``hub sign``,
``hub rollback``). MQTT has no compare-and-set, so two hubs publishing the same slot at the
same moment are not caught; one hub publishing at a time is.

An agent release (``hub sign --agent``) goes the same way without a hub server: into the
group's agent slot (``_agent``) and to single devices, relayed exactly as signed.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import aiomqtt

from edgeagent.fleet.agent_manifest import AGENT_SLOT, AgentManifest
from edgeagent.fleet.manifest import ReleaseManifest
from edgeagent.fleet.mqtt import client_options, connect_properties
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.signing import TrustError
from edgeagent.fleet.topics import DeviceTopics, GroupTopics, Topic
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.keys import HubError
from edgeagent.hub.release_checks import (
    AnyRelease,
    authentic,
    check_for_fleet,
    model_of,
    read_manifest,
)

MAX_REPORT_BYTES = 256 * 1024  # a device's state report or event is a few KiB


def hub_client(settings: MqttSettings, role: str) -> aiomqtt.Client:
    """A short-lived, clean-session client for one hub command; the broker delivers it no
    message bigger than a report could be (Maximum-Packet-Size)."""
    return aiomqtt.Client(
        **client_options(settings, f"edgeagent-hub-{role}-{secrets.token_hex(4)}"),
        clean_start=True,
        properties=connect_properties(MAX_REPORT_BYTES),
    )


def read_any_release(
    path: Path, trust: Path | None = None, *, now: datetime | None = None
) -> tuple[bytes, AnyRelease]:
    """Load a release envelope of either kind (``*.release.json``, ``*.agent-release.json``)
    and its manifest; with ``trust``, refuse it unless a device trusting that file would accept
    it (signatures under its kind's role, format, both expiries, issue time)."""
    try:
        envelope = path.read_bytes()
    except OSError as exc:
        raise HubError(f"{path}: cannot read the release ({exc.strerror})") from exc
    try:
        if trust is None:
            return envelope, read_manifest(envelope)
        manifest = authentic(envelope, TrustStore.load(trust), now=now)
        check_for_fleet(manifest, serial_floor=None, now=now)
    except TrustError as exc:
        raise HubError(f"{path}: devices would refuse this release: {exc}") from exc
    return envelope, manifest


def read_release(
    path: Path, trust: Path | None = None, *, now: datetime | None = None
) -> tuple[bytes, ReleaseManifest]:
    """A model release (``read_any_release``); an agent release is refused here (the commands
    that call this re-sign or roll out models; ``hub publish`` takes either kind)."""
    envelope, manifest = read_any_release(path, trust, now=now)
    if not isinstance(manifest, ReleaseManifest):
        raise HubError(
            f"{path}: an agent release, not a model's: publish it with hub publish, or deploy "
            "it with hub rollout --server"
        )
    return envelope, manifest


def slot_of(manifest: AnyRelease) -> str:
    """The group release slot ``manifest`` goes into: its model's, or the agent's."""
    return AGENT_SLOT if isinstance(manifest, AgentManifest) else manifest.model


@dataclass(frozen=True)
class ReleaseSlot(Topic):
    """A group's retained slot of one model (or the agent's, ``_agent``), as ``hub publish``
    fills it: ``publish`` reads what it holds first and refuses a release whose serial is not
    above it (module docstring). Plain ``Topic`` objects are published as they are."""

    model: str


def release_topics(
    prefix: str, group: str | None, devices: Sequence[str], model: str
) -> list[Topic]:
    topics: list[Topic] = [DeviceTopics(prefix, device).release for device in devices]
    if group:
        slot = GroupTopics(prefix, group).release(model)
        topics.insert(0, ReleaseSlot(slot.name, slot.retained, model))
    if not topics:
        raise HubError("say where to publish: --group GROUP and/or --device ID")
    return topics


async def publish(settings: MqttSettings, topics: Sequence[Topic], envelope: bytes) -> None:
    """Publish with QoS 1 (retained where the topic's kind says so) and wait for each ack.

    For a ``ReleaseSlot`` the slot is read first, and nothing at all is published when the
    envelope's serial is not above the release retained there (``HubError``).
    """
    try:
        async with hub_client(settings, "publish") as client:
            for slot in topics:
                if isinstance(slot, ReleaseSlot):
                    held = await _retained(client, slot, settings)
                    _check_slot(slot, held, envelope)
            for topic in topics:
                await client.publish(topic.name, envelope, qos=1, retain=topic.retained)
    except aiomqtt.MqttError as exc:
        raise HubError(f"broker {settings.host}:{settings.port}: {exc}") from exc


async def _retained(client: aiomqtt.Client, slot: Topic, settings: MqttSettings) -> bytes | None:
    """What ``slot`` retains (None: nothing). The broker sends a subscription's retained
    message before it handles our next packet, so once a marker we publish after subscribing
    comes back, anything retained has arrived; no answer within the connect time-out is an
    error, never "empty" (a slot that could not be read is not known to be empty)."""
    marker = f"{settings.topic_prefix}/hub/{client.identifier}/slot/{secrets.token_hex(8)}"
    acl = "the hub's broker user needs read access to it and to <prefix>/hub/#"
    granted = await client.subscribe(slot.name, qos=1)
    if any(getattr(code, "is_failure", False) for code in granted):
        raise HubError(f"the broker refused to let this client read {slot.name}: {acl}")
    await client.subscribe(marker, qos=1)
    await client.publish(marker, b"", qos=1)

    async def first_answer() -> bytes | None:
        async for message in client.messages:
            if message.topic.value == marker:
                return None
            if message.topic.value == slot.name and message.retain:
                return bytes(message.payload)
        raise aiomqtt.MqttError("disconnected while reading the slot")

    try:
        return await asyncio.wait_for(first_answer(), settings.connect_timeout_s)
    except asyncio.TimeoutError:
        pass
    raise HubError(
        f"broker {settings.host}:{settings.port}: could not read the release retained on "
        f"{slot.name} within {settings.connect_timeout_s:g} s ({acl}); nothing published"
    )


def _release_in(payload: bytes | None, slot: str) -> AnyRelease | None:
    """The manifest of a retained envelope that belongs in ``slot``, or None: an empty slot,
    bytes that are no release, or another model's release (devices take none of them, so none
    is a floor). Read unverified: it can only make ``hub publish`` refuse, never send anything."""
    if not payload:
        return None
    try:
        manifest = read_manifest(payload)
    except TrustError:
        return None
    return manifest if slot_of(manifest) == slot else None


def _check_slot(slot: ReleaseSlot, held: bytes | None, envelope: bytes) -> None:
    new = _release_in(envelope, slot.model)
    if new is None:
        what = "an agent release" if slot.model == AGENT_SLOT else f"a release of {slot.model}"
        raise HubError(f"{slot.name}: only {what} can go in this slot")
    current = _release_in(held, slot.model)
    if current is not None and new.serial <= current.serial:
        raise HubError(
            f"{slot.name} holds {model_of(current)} {current.version} serial {current.serial} "
            f"(deployment {current.deployment_id}); this release's serial {new.serial} is not "
            "above it: devices that have it refuse it, but a device that starts later would "
            "install it. Sign a new release instead (hub sign; hub rollback for an older "
            "version)"
        )


async def clear_release(settings: MqttSettings, group: str, model: str) -> Topic:
    """Remove ``model``'s retained release in ``group`` (an empty retained message deletes it)."""
    topic = GroupTopics(settings.topic_prefix, group).release(model)
    await publish(settings, [topic], b"")
    return topic


async def clear_release_of(
    settings: MqttSettings, group: str, model: str, deployment_id: str
) -> bool:
    """Clear ``model``'s retained slot in ``group`` if it holds a release of ``deployment_id``
    (an aborted deployment's: devices joining later would install it); any other release
    stays — it is the group's current one. True when it was cleared."""
    slot = GroupTopics(settings.topic_prefix, group).release(model)
    try:
        async with hub_client(settings, "cancel") as client:
            held = _release_in(await _retained(client, slot, settings), model)
            if held is None or held.deployment_id != deployment_id:
                return False
            await client.publish(slot.name, b"", qos=1, retain=True)
    except aiomqtt.MqttError as exc:
        raise HubError(f"broker {settings.host}:{settings.port}: {exc}") from exc
    return True
