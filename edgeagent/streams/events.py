"""The cameras' outbox on the agent's MQTT link: track events through the on-disk spool,
retained states (presence, counts) and Home Assistant discovery configs re-sent on every
(re)connect.

Events are delivered oldest first and leave the spool only once the broker has acknowledged
them, so a broker outage delays them but loses none (unless the spool's budget is exceeded,
which is counted). States are "latest value" facts: only the newest is kept and sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any, Protocol

from edgeagent.fleet.topics import DeviceTopics
from edgeagent.streams.spool import EventSpool

log = logging.getLogger(__name__)


class Link(Protocol):
    """What the outbox needs of the MQTT link (``fleet.mqtt.MqttLink``)."""

    connected: asyncio.Event
    connections: int

    async def publish(self, topic: str, payload: bytes | str, *, retain: bool = False) -> None: ...

    async def run(self) -> None: ...

    async def close(self) -> None: ...


class Outbox:
    """Spooled events and retained states of every stream, sent over one link."""

    def __init__(self, spool: EventSpool, topics: DeviceTopics, link: Link | None) -> None:
        self.spool = spool
        self.topics = topics
        self.link = link
        self.spooled = 0  # events accepted (all time)
        self.delivered = 0  # events the broker acknowledged
        self.last_error = ""
        self._retained: dict[str, str] = {}  # topic → latest payload (states and configs)
        self._unsent: set[str] = set()
        self._wake = asyncio.Event()

    async def event(self, stream: str, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Spool one track event (``kind`` = start, update or end); the event as sent."""
        event = {
            "id": uuid.uuid4().hex,
            "type": kind,
            "stream": stream,
            "emitted_at": round(time.time(), 3),
            **fields,
        }
        topic = self.topics.stream(stream, "events").name
        await asyncio.to_thread(self.spool.append, topic, event)  # fsync off the loop
        self.spooled += 1
        self._wake.set()
        return event

    def retain(self, topic: str, payload: str | dict[str, Any]) -> None:
        """Keep ``payload`` as ``topic``'s retained value (sent now, and on each reconnect)."""
        text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
        if self._retained.get(topic) != text:
            self._retained[topic] = text
            self._unsent.add(topic)
            self._wake.set()

    def status(self) -> dict[str, Any]:
        return {
            **self.spool.status(),
            "spooled": self.spooled,
            "delivered": self.delivered,
            "link": self.link is not None,
            "last_error": self.last_error,
        }

    async def run(self) -> None:
        """Send whatever is pending whenever the link is up (until cancelled)."""
        if self.link is None:
            return  # no MQTT: events stay in the (bounded) spool
        link, session = self.link, -1
        while True:
            await link.connected.wait()
            if link.connections != session:  # a new session: every retained value again
                session = link.connections
                self._unsent = set(self._retained)
            try:
                if await self._send_one(link):
                    continue
            except Exception as exc:  # aiomqtt.MqttError, a lost connection: try again
                self.last_error = str(exc)
                log.debug("stream outbox: %s", exc)
                self._wake.clear()
                await _wait(self._wake, 1.0)
                continue
            self._wake.clear()
            if not self._unsent and len(self.spool) == 0:
                await _wait(self._wake, 5.0)  # news, or a periodic look at the session

    async def _send_one(self, link: Link) -> bool:
        """Send one retained value or the oldest event; False when nothing is pending."""
        if self._unsent:
            topic = next(iter(self._unsent))
            await link.publish(topic, self._retained[topic], retain=True)
            self._unsent.discard(topic)
            return True
        oldest = self.spool.oldest()
        if oldest is None:
            return False
        sequence, topic, payload = oldest
        await link.publish(topic, payload)
        self.spool.remove(sequence)
        self.delivered += 1
        return True


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
