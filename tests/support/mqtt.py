"""A device-side MQTT link for tests: runs in the test's loop and records what it receives."""

from __future__ import annotations

import asyncio

from edgeagent.aio import cancel_and_wait
from edgeagent.fleet.mqtt import MqttLink
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import Topics


class Device:
    """An MqttLink running in this loop, recording what it receives."""

    def __init__(self, settings: MqttSettings, device_id: str = "dev-1") -> None:
        self.received: list[tuple[str, bytes]] = []
        self.topics = Topics(settings.topic_prefix, "lab", device_id)
        self.link = MqttLink(settings, self.topics, self._handle)
        self.task: asyncio.Task | None = None

    async def _handle(self, topic: str, payload: bytes) -> None:
        self.received.append((topic, payload))

    async def start(self) -> Device:
        self.task = asyncio.create_task(self.link.run())
        return self

    async def stop(self) -> None:
        await self.link.close()
        if self.task is not None:  # one cancel may be lost mid-publish (edgeagent.aio)
            await cancel_and_wait([self.task])
