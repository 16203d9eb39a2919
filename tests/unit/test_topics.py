"""The one topic layout: names, which kinds are retained, and parsing device topics back."""

from __future__ import annotations

import pytest

from edgeagent.fleet.topics import DeviceTopics, GroupTopics, Topics, purpose_of, release_model


def test_group_topics_are_retained_and_device_releases_are_not() -> None:
    group = GroupTopics("fleet/a", "lab")
    release = group.release("mnv2")
    assert (release.name, release.retained) == ("fleet/a/group/lab/release/mnv2", True)
    assert group.releases == "fleet/a/group/lab/release/+"
    assert (group.trust.name, group.trust.retained) == ("fleet/a/group/lab/trust", True)
    device = DeviceTopics("fleet/a", "dev-1")
    assert (device.release.name, device.release.retained) == ("fleet/a/device/dev-1/release", False)
    assert device.state.retained and device.availability.retained and not device.events.retained


def test_the_device_view_spells_the_same_topics() -> None:
    topics = Topics("edgeagent", "lab", "dev-1")
    assert topics.group_releases == GroupTopics("edgeagent", "lab").releases
    assert topics.device_release == DeviceTopics("edgeagent", "dev-1").release.name
    assert DeviceTopics("edgeagent").events.name == "edgeagent/device/+/events"


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("p/x/device/dev-1/state", ("dev-1", "state")),
        ("p/x/device/dev-1/events", ("dev-1", "events")),
        ("p/x/device/+/events", None),
        ("p/x/device/dev-1/other", None),
        ("p/x/device/dev-1/state/extra", None),
        ("p/x/group/lab/release", None),
        ("q/device/dev-1/state", None),
        ("p/x/device//state", None),
    ],
)
def test_device_topics_parse_back(topic: str, expected) -> None:
    assert DeviceTopics.parse("p/x", topic) == expected


def test_purpose_is_the_topic_kind() -> None:
    assert purpose_of(GroupTopics("p", "g").trust.name) == "trust"
    assert purpose_of(GroupTopics("p", "g").release("trust").name) == "release"
    assert purpose_of(GroupTopics("p", "release").trust.name) == "trust"
    assert purpose_of(DeviceTopics("p", "d").release.name) == "release"
    assert purpose_of(DeviceTopics("p", "d").state.name) is None
    assert purpose_of("p/group/g/release") is None  # the single slot of release format 1


def test_a_retained_slot_names_its_model() -> None:
    assert release_model(GroupTopics("p/x", "g").release("mnv2").name) == "mnv2"
    assert release_model(DeviceTopics("p", "d").release.name) is None
    assert release_model(GroupTopics("p", "g").trust.name) is None


@pytest.mark.parametrize("model", ["", "a/b", "+", "#"])
def test_a_model_name_that_is_not_one_topic_level_is_refused(model: str) -> None:
    with pytest.raises(ValueError, match="topic level"):
        GroupTopics("p", "g").release(model)
    with pytest.raises(ValueError, match="unknown device topic kind"):
        DeviceTopics("p", "d").kind("secrets")
