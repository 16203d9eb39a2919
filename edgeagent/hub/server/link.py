"""The hub server's own MQTT session: persistent, so no device answer is lost while it is down.

The session is MQTT 5 with ``clean_start=False``, a stable client id and a session expiry:
events that devices publish while the hub restarts (a SIGKILL included) are queued by the
broker and delivered when it reconnects. After subscribing to the devices' topics the link
sends itself a marker through the broker; the broker delivers retained messages for a
subscription before it handles our next packet, so when the marker comes back every retained
report is ahead of it in the ingest queue (``Ingest.synced``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgeagent.fleet.mqtt import backoff_delays, client_options
from edgeagent.fleet.settings import MqttSettings
from edgeagent.hub.server.ingest import Incoming, Ingest, SyncMarker

log = logging.getLogger(__name__)

# Retained kinds are read at QoS 0: the broker sends a subscription's retained messages all at
# once, and at QoS 1 it queues at most max_queued_messages (Mosquitto: 1000) beyond its
# in-flight window and silently drops the rest — most of a large fleet. They are the latest
# picture and come again on every resubscribe, so nothing is lost at QoS 0. Events stay QoS 1:
# those sent while the hub is down must wait for it in its persistent session.
SUBSCRIPTIONS = (("state", 0), ("availability", 0), ("events", 1))


class BrokerUnavailable(ConnectionError):
    """Publishing while the link is down; the controller retries after the next connect."""


class HubLink:
    def __init__(
        self,
        settings: MqttSettings,
        ingest: Ingest,
        *,
        client_id: str,
        on_connect: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.ingest = ingest
        self.client_id = client_id
        self.on_connect = on_connect  # the controller sends what waited for the broker
        self.connected = asyncio.Event()
        self._client: aiomqtt.Client | None = None

    def _sync_topic(self, token: str) -> str:
        return f"{self.settings.topic_prefix}/hub/{self.client_id}/sync/{token}"

    async def publish(self, topic: str, payload: bytes) -> None:
        """QoS 1, not retained, acknowledged by the broker before this returns."""
        client = self._client
        if client is None or not self.connected.is_set():
            raise BrokerUnavailable(f"broker {self.settings.host}:{self.settings.port} is down")
        try:
            await client.publish(topic, payload, qos=1)
        except aiomqtt.MqttError as exc:
            raise BrokerUnavailable(str(exc)) from exc

    async def run(self) -> None:
        delays = backoff_delays(self.settings.reconnect_min_s, self.settings.reconnect_max_s)
        while True:
            try:
                await self._session()
            except aiomqtt.MqttError as exc:
                log.warning("MQTT %s:%s: %s", self.settings.host, self.settings.port, exc)
            finally:
                self.connected.clear()
                self._client = None
            await asyncio.sleep(next(delays))

    async def _session(self) -> None:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = self.settings.session_expiry_s
        client = aiomqtt.Client(
            **client_options(self.settings, self.client_id),
            clean_start=False,
            properties=properties,
        )
        await client.__aenter__()
        try:
            await self._serve(client)
        finally:
            # aiomqtt's exit waits, without a time-out, for the broker to acknowledge the
            # DISCONNECT, which never comes while we are being cancelled: bound it.
            with contextlib.suppress(aiomqtt.MqttError, asyncio.TimeoutError):
                await asyncio.wait_for(
                    client.__aexit__(None, None, None), self.settings.connect_timeout_s
                )

    async def _serve(self, client: aiomqtt.Client) -> None:
        """Subscribe, send the sync marker, then hand every message to the ingest queue."""
        prefix = self.settings.topic_prefix
        token = secrets.token_hex(8)
        self.ingest.expect_sync(token)
        for kind, qos in SUBSCRIPTIONS:
            await client.subscribe(f"{prefix}/device/+/{kind}", qos=qos)
        await client.subscribe(self._sync_topic(token), qos=1)
        await client.publish(self._sync_topic(token), b"", qos=1)
        self._client = client
        self.connected.set()
        log.info(
            "MQTT connected to %s:%s as %s",
            self.settings.host,
            self.settings.port,
            self.client_id,
        )
        self.on_connect()
        sync_prefix = self._sync_topic("")
        async for message in client.messages:
            topic = message.topic.value
            if topic.startswith(sync_prefix):
                await self.ingest.submit(SyncMarker(topic[len(sync_prefix) :]))
                with contextlib.suppress(aiomqtt.MqttError):
                    await client.unsubscribe(topic)
                continue
            payload = message.payload
            if not isinstance(payload, (bytes, bytearray)):
                payload = str(payload or "").encode()
            await self.ingest.submit(Incoming(topic, bytes(payload), bool(message.retain)))
