"""The MQTT topic layout, spelled once for the device and the hub alike.

Two kinds of topic exist: *group* topics (``<p>/group/<group>/…``), which the hub publishes
retained so a device that joins later still finds the current trust file and the current
release of *every* model (one retained topic per (group, model): ``<p>/group/<g>/release/<m>``;
release format 2), and *device* topics (``<p>/device/<id>/…``). Whether a topic is retained
is a property of its kind, decided here, so no caller has to guess it from its spelling.
"""

from __future__ import annotations

from dataclasses import dataclass

ANY = "+"  # the MQTT single-level wildcard: "any device" in a subscription
DEVICE_KINDS = ("release", "availability", "state", "events")
_RETAINED_DEVICE_KINDS = frozenset({"availability", "state"})
STREAM_STATE_KINDS = ("presence", "count")  # retained per (stream, label)


@dataclass(frozen=True)
class Topic:
    """One topic and whether messages on it are published retained."""

    name: str
    retained: bool

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class GroupTopics:
    """The hub → devices topics of one group; all retained (late joiners read them)."""

    prefix: str
    group: str

    def release(self, model: str) -> Topic:
        """The retained slot of ``model``'s current release in this group."""
        if not model or any(c in model for c in "/+#"):
            raise ValueError(f"{model!r} cannot be a topic level")
        return Topic(f"{self.prefix}/group/{self.group}/release/{model}", retained=True)

    @property
    def releases(self) -> str:
        """The subscription that receives every model's release of this group."""
        return f"{self.prefix}/group/{self.group}/release/{ANY}"

    @property
    def trust(self) -> Topic:
        return Topic(f"{self.prefix}/group/{self.group}/trust", retained=True)


@dataclass(frozen=True)
class DeviceTopics:
    """The topics of one device (or of every device, with ``device_id=ANY``)."""

    prefix: str
    device_id: str = ANY

    def kind(self, kind: str) -> Topic:
        if kind not in DEVICE_KINDS:
            raise ValueError(f"unknown device topic kind {kind!r}; kinds: {DEVICE_KINDS}")
        name = f"{self.prefix}/device/{self.device_id}/{kind}"
        return Topic(name, retained=kind in _RETAINED_DEVICE_KINDS)

    @property
    def release(self) -> Topic:
        """Not retained: a rollout wave reaches an offline device through its session."""
        return self.kind("release")

    @property
    def availability(self) -> Topic:
        return self.kind("availability")

    @property
    def state(self) -> Topic:
        return self.kind("state")

    @property
    def events(self) -> Topic:
        return self.kind("events")

    def stream(self, stream: str, kind: str, label: str = "") -> Topic:
        """A camera's topics: ``…/stream/<stream>/events`` (track start/update/end, not
        retained) and its retained states ``…/stream/<stream>/presence/<label>`` ("ON"/"OFF")
        and ``…/stream/<stream>/count/<label>`` (objects in view)."""
        for level in (stream, label):
            if any(c in level for c in "/+#"):
                raise ValueError(f"{level!r} cannot be a topic level")
        if kind == "events":
            return Topic(f"{self.prefix}/device/{self.device_id}/stream/{stream}/events", False)
        if kind not in STREAM_STATE_KINDS or not label:
            raise ValueError(f"unknown stream topic {kind!r}/{label!r}")
        name = f"{self.prefix}/device/{self.device_id}/stream/{stream}/{kind}/{label}"
        return Topic(name, retained=True)

    @staticmethod
    def parse(prefix: str, topic: str) -> tuple[str, str] | None:
        """``(device_id, kind)`` of a device topic under ``prefix``; None for anything else."""
        head = f"{prefix}/device/"
        if not topic.startswith(head):
            return None
        device, _, kind = topic[len(head) :].partition("/")
        if not device or device == ANY or kind not in DEVICE_KINDS:
            return None
        return device, kind


@dataclass(frozen=True)
class Topics:
    """Every topic one device uses, derived from the prefix, its group and its id."""

    prefix: str
    group: str
    device_id: str

    @property
    def of_group(self) -> GroupTopics:
        return GroupTopics(self.prefix, self.group)

    @property
    def of_device(self) -> DeviceTopics:
        return DeviceTopics(self.prefix, self.device_id)

    @property
    def group_releases(self) -> str:
        return self.of_group.releases

    @property
    def group_trust(self) -> str:
        return self.of_group.trust.name

    @property
    def device_release(self) -> str:
        return self.of_device.release.name

    @property
    def availability(self) -> str:
        return self.of_device.availability.name

    @property
    def state(self) -> str:
        return self.of_device.state.name

    @property
    def events(self) -> str:
        return self.of_device.events.name

    @property
    def subscriptions(self) -> tuple[str, ...]:
        return (self.group_releases, self.group_trust, self.device_release)


def release_model(topic: str) -> str | None:
    """The model whose retained slot ``topic`` is (``…/group/<g>/release/<model>``), else None."""
    levels = topic.split("/")
    if len(levels) >= 4 and levels[-4] == "group" and levels[-2] == "release":
        return levels[-1]
    return None


def purpose_of(topic: str) -> str | None:
    """``"release"`` or ``"trust"``: what a hub → device topic carries, from its shape
    (``…/group/<g>/release/<model>``, ``…/device/<id>/release``, ``…/group/<g>/trust``).

    The updater keys its de-duplication on this, so an envelope copied onto the wrong topic
    can never shadow the same bytes on the right one.
    """
    if release_model(topic) is not None:
        return "release"
    levels = topic.split("/")
    if len(levels) >= 3 and levels[-3] == "device" and levels[-1] == "release":
        return "release"
    if len(levels) >= 3 and levels[-3] == "group" and levels[-1] == "trust":
        return "trust"
    return None


def discovery_topic(prefix: str, component: str, node_id: str, object_id: str) -> Topic:
    """Home Assistant's MQTT discovery slot of one entity (retained: HA reads it at start)."""
    return Topic(f"{prefix}/{component}/{node_id}/{object_id}/config", retained=True)
