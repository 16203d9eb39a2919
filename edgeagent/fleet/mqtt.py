"""The device's MQTT link to the hub: persistent session, QoS 1, Last Will, retained state.

Topic scheme (``<p>`` is ``[mqtt] topic_prefix``, default ``edgeagent``)::

    <p>/group/<group>/release       hub → devices  signed release envelope   QoS 1, retained
    <p>/group/<group>/trust         hub → devices  signed trust file (N+1)   QoS 1, retained
    <p>/device/<id>/release         hub → device   release for one device    QoS 1 (rollout waves)
    <p>/device/<id>/availability    device → hub   "online" / "offline"      QoS 1, retained;
                                                   "offline" is the Last Will
    <p>/device/<id>/state           device → hub   JSON state report         QoS 1, retained
    <p>/device/<id>/events          device → hub   JSON progress / outcome   QoS 1

An MQTT message is only a *hint*: everything received is verified by the updater before it
is believed. The session is persistent (MQTT 5 ``clean_start=False`` with a session expiry,
the client id stable per device), so a release published to a device while it is offline is
queued by the broker and delivered when it reconnects; the group release is also retained so
a device that joins later still finds it. Reconnects back off exponentially with jitter, so
a fleet does not reconnect in lock-step after a broker restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgeagent.aio import cancel_and_wait, spawn
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import Topics

log = logging.getLogger(__name__)

MessageHandler = Callable[[str, bytes], Awaitable[None]]
_MAX_QUEUED_EVENTS = 256  # events kept while offline; the oldest are dropped first
# A PUBLISH packet is the payload plus its fixed header, topic and properties; this allowance
# lets every payload up to the configured size through the broker's Maximum-Packet-Size check.
PACKET_OVERHEAD_BYTES = 1024


def connect_properties(max_payload_bytes: int) -> Properties:
    """CONNECT properties announcing our MQTT 5 Maximum-Packet-Size: the broker then never
    sends a bigger message (it drops it), so an oversized one never reaches our memory."""
    properties = Properties(PacketTypes.CONNECT)
    properties.MaximumPacketSize = max_payload_bytes + PACKET_OVERHEAD_BYTES
    return properties


def tls_context(settings: MqttSettings) -> ssl.SSLContext | None:
    """A verifying client context: the broker's CA, plus our certificate for mutual TLS."""
    if not settings.tls:
        return None
    context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
    if settings.cert_file and settings.key_file:
        context.load_cert_chain(str(settings.cert_file), str(settings.key_file))
    return context


def client_options(settings: MqttSettings, client_id: str) -> dict[str, Any]:
    """The aiomqtt.Client keywords shared by the device link and the hub tools."""
    return {
        "hostname": settings.host,
        "port": settings.port,
        "identifier": client_id,
        "username": settings.username or None,
        "password": settings.password or None,
        "protocol": aiomqtt.ProtocolVersion.V5,
        "keepalive": settings.keepalive_s,
        "tls_context": tls_context(settings),
        "timeout": settings.connect_timeout_s,
    }


def backoff_delays(minimum: float, maximum: float) -> Any:
    """Exponential back-off with "equal jitter": half fixed, half random, capped at maximum."""
    attempt = 0
    while True:
        ceiling = min(maximum, minimum * 2**attempt)
        yield ceiling / 2 + random.uniform(0, ceiling / 2)
        attempt += 1


class MqttLink:
    """Keeps one persistent session to the broker and hands received hints to ``handler``.

    ``publish_state`` and ``publish_event`` never block on the network: the latest state is
    re-published (retained) after every reconnect, and events wait in a bounded queue while the
    broker is unreachable.
    """

    def __init__(self, settings: MqttSettings, topics: Topics, handler: MessageHandler) -> None:
        self.settings = settings
        self.topics = topics
        self.handler = handler
        self.client_id = settings.client_id or f"edgeagent-{topics.device_id}"
        self.connected = asyncio.Event()
        self.connections = 0  # successful connects so far (status and tests)
        self.oversized = 0  # messages the broker delivered although over max_message_bytes
        self.last_error = ""
        self._client: aiomqtt.Client | None = None
        self._state: dict[str, Any] | None = None
        self._events: deque[dict[str, Any]] = deque(maxlen=_MAX_QUEUED_EVENTS)
        self._wake = asyncio.Event()

    def status(self) -> dict[str, Any]:
        return {
            "broker": f"{self.settings.host}:{self.settings.port}",
            "connected": self.connected.is_set(),
            "connections": self.connections,
            "oversized_dropped": self.oversized,
            "last_error": self.last_error,
            "topics": {"state": self.topics.state, "subscribed": list(self.topics.subscriptions)},
        }

    def publish_state(self, state: dict[str, Any]) -> None:
        self._state = state
        self._wake.set()

    def publish_event(self, event: dict[str, Any]) -> None:
        self._events.append(event)
        self._wake.set()

    async def publish(self, topic: str, payload: bytes | str, *, retain: bool = False) -> None:
        """Publish now at QoS 1 and wait for the broker's PUBACK; MqttError when not connected
        or not acknowledged in ``connect_timeout_s``. For callers that keep their own durable
        queue (a camera's event spool) and delete a message only once the broker has it."""
        client = self._client
        if client is None or not self.connected.is_set():
            raise aiomqtt.MqttError("not connected to the broker")
        try:
            await asyncio.wait_for(
                client.publish(topic, payload, qos=1, retain=retain),
                self.settings.connect_timeout_s,
            )
        except asyncio.TimeoutError:
            raise aiomqtt.MqttError(f"no PUBACK for {topic} in time") from None

    async def run(self) -> None:
        """Connect, serve, and reconnect forever (until cancelled)."""
        delays = backoff_delays(self.settings.reconnect_min_s, self.settings.reconnect_max_s)
        while True:
            before = self.connections
            try:
                await self._session()
            except aiomqtt.MqttError as exc:
                self.last_error = str(exc)
                log.warning("MQTT %s: %s", self.status()["broker"], exc)
            finally:
                self.connected.clear()
                self._client = None
            if self.connections > before:  # it was up for a while: start the back-off afresh
                delays = backoff_delays(
                    self.settings.reconnect_min_s, self.settings.reconnect_max_s
                )
            await asyncio.sleep(next(delays))

    async def _session(self) -> None:
        properties = connect_properties(self.settings.max_message_bytes)
        properties.SessionExpiryInterval = self.settings.session_expiry_s
        will = aiomqtt.Will(self.topics.availability, b"offline", qos=1, retain=True)
        client = aiomqtt.Client(
            **client_options(self.settings, self.client_id),
            will=will,
            clean_start=False,
            properties=properties,
        )
        await client.__aenter__()
        try:
            self._client = client
            self.connections += 1
            self.last_error = ""
            await client.publish(self.topics.availability, b"online", qos=1, retain=True)
            for topic in self.topics.subscriptions:
                await client.subscribe(topic, qos=1)
            self.connected.set()
            log.info("MQTT connected to %s as %s", self.status()["broker"], self.client_id)
            sender = spawn(self._send_loop(client), name="mqtt-send")
            try:
                async for message in client.messages:
                    await self._dispatch(message)
            finally:
                await cancel_and_wait([sender])  # publishing: one cancel may be lost (aio)
        finally:
            await self._disconnect(client)

    async def _disconnect(self, client: aiomqtt.Client) -> None:
        """Leave the broker, but never wait for it forever.

        aiomqtt's ``__aexit__`` waits without a time-out for the broker to acknowledge the
        DISCONNECT; when the link is being cancelled (agent shutdown) that acknowledgement can
        never be processed, and the agent would hang in its stop. Bounded here instead.
        """
        with contextlib.suppress(aiomqtt.MqttError, asyncio.TimeoutError):
            await asyncio.wait_for(
                client.__aexit__(None, None, None), self.settings.connect_timeout_s
            )

    async def _dispatch(self, message: aiomqtt.Message) -> None:
        payload = message.payload
        if not isinstance(payload, (bytes, bytearray)):
            payload = str(payload or "").encode()
        if len(payload) > self.settings.max_message_bytes:
            self.oversized += 1
            log.warning(
                "dropped a %d-byte message on %s ([mqtt] max_message_bytes is %d)",
                len(payload),
                message.topic.value,
                self.settings.max_message_bytes,
            )
            return
        if not payload:
            return  # a cleared retained message
        try:
            await self.handler(message.topic.value, bytes(payload))
        except Exception:  # a handler bug must not take the link down
            log.exception("handling the message on %s failed", message.topic.value)

    async def _send_loop(self, client: aiomqtt.Client) -> None:
        """Publish the latest state (retained) and queued events whenever there is news."""
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                if self._state is not None:
                    state = json.dumps(self._state, default=str)
                    await client.publish(self.topics.state, state, qos=1, retain=True)
                while self._events:
                    event = json.dumps(self._events[0], default=str)
                    await client.publish(self.topics.events, event, qos=1)
                    self._events.popleft()
            except aiomqtt.MqttError as exc:  # keep what is unsent; try again shortly
                log.warning("MQTT publish failed (%s); retrying", exc)
                await asyncio.sleep(1.0)
                self._wake.set()

    async def close(self) -> None:
        """Say "offline" cleanly (a graceful stop does not fire the Last Will)."""
        client = self._client
        if client is not None and self.connected.is_set():
            with contextlib.suppress(aiomqtt.MqttError, asyncio.TimeoutError):
                await asyncio.wait_for(
                    client.publish(self.topics.availability, b"offline", qos=1, retain=True), 5
                )
