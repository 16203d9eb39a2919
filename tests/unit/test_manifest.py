"""Release manifests: strict parsing, and the policy checks made before anything is downloaded."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from edgeagent.fleet.manifest import (
    ManifestError,
    Refused,
    check_release,
    parse_manifest,
)
from edgeagent.fleet.signing import format_time
from tests.unit.test_trust_sim import DEVICE, NOW, Simulator, dumps


@pytest.fixture
def sim() -> Simulator:
    return Simulator()


def test_parse_reads_every_field(sim: Simulator) -> None:
    manifest = parse_manifest(dumps(sim.release_doc(targets={"profiles": ["rpi5"]})))
    assert (manifest.model, manifest.version, manifest.deployment_id) == ("digits", "2", "dep-1")
    assert manifest.artifact.size == 4096
    assert manifest.artifact.url == "http://hub.local/digits-2.tar.gz"
    assert manifest.targets.profiles == ("rpi5",)
    assert manifest.targets.device_ids == ()
    assert manifest.expires == NOW + timedelta(days=7)


def test_to_payload_round_trips(sim: Simulator) -> None:
    manifest = parse_manifest(dumps(sim.release_doc()))
    assert parse_manifest(manifest.to_payload()) == manifest
    assert json.loads(manifest.to_payload()) == sim.release_doc()


def _set(path: str, value):
    def change(doc: dict) -> None:
        *parents, last = path.split(".")
        target = doc
        for key in parents:
            target = target[key]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return change


_DELETE = object()
_VARIANT = Simulator().release_doc()["variants"][0]
MALFORMED = {
    "type trust": _set("type", "trust"),
    "missing model": _set("model", _DELETE),
    "unknown field": _set("channel", "beta"),
    "model with slash": _set("model", "../etc"),
    "version word": _set("version", "latest"),
    "version int": _set("version", 2),
    "version four parts": _set("version", "1.2.3.4"),
    "sha256 short": _set("artifact.sha256", "abc"),
    "sha256 upper": _set("artifact.sha256", "AB" * 32),
    "size zero": _set("artifact.size", 0),
    "size negative": _set("artifact.size", -5),
    "size bool": _set("artifact.size", True),
    "size string": _set("artifact.size", "4096"),
    "url ftp": _set("artifact.url", "ftp://hub/x.tar.gz"),
    "url relative": _set("artifact.url", "/x.tar.gz"),
    "url missing": _set("artifact.url", _DELETE),
    "artifact extra": _set("artifact.mirror", "http://x"),
    "variants missing": _set("variants", _DELETE),
    "variants empty": _set("variants", []),
    "variants not list": _set("variants", {"runtime": "onnxruntime"}),
    "variant runtime upper": _set("variants", [{**_VARIANT, "runtime": "ONNX"}]),
    "variant precision path": _set("variants", [{**_VARIANT, "precision": "../x"}]),
    "variant without sha256": _set(
        "variants", [{k: v for k, v in _VARIANT.items() if k != "sha256"}]
    ),
    "variant extra field": _set("variants", [{**_VARIANT, "device": "GPU"}]),
    "variant url ftp": _set("variants", [{**_VARIANT, "url": "ftp://hub/x"}]),
    "variant listed twice": _set("variants", [_VARIANT, _VARIANT]),
    "too many variants": _set("variants", [{**_VARIANT, "precision": f"p{n}"} for n in range(65)]),
    "targets unknown criterion": _set("targets.regions", ["eu"]),
    "targets not list": _set("targets.profiles", "rpi5"),
    "targets empty string": _set("targets.device_ids", [""]),
    "issued naive": _set("issued_at", "2026-06-01T12:00:00"),
    "expires garbage": _set("expires", "soon"),
    "expires before issued": _set("expires", format_time(NOW - timedelta(days=1))),
    "deployment id empty": _set("deployment_id", ""),
    "deployment id wildcard": _set("deployment_id", "a/+/#"),
    "min agent version word": _set("min_agent_version", "new"),
    # \A…\Z, ASCII only, bounded (issue 10 item 4): each of these was accepted before
    "model trailing newline": _set("model", "tiny\n"),
    "version trailing newline": _set("version", "21\n"),
    "version arabic-indic digits": _set("version", "\u0662\u0661"),
    "version 256 digits": _set("version", "1" * 256),
    "version part of 10 digits": _set("version", "1.1234567890"),
    "min agent version trailing newline": _set("min_agent_version", "1.0.0\n"),
    "deployment id trailing newline": _set("deployment_id", "dep-1\n"),
    "sha256 trailing newline": _set("artifact.sha256", "ab" * 32 + "\n"),
    "target with newline": _set("targets.device_ids", ["dev-1\n"]),
    "url of 3000 characters": _set("artifact.url", "http://hub/" + "a" * 3000),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifests_name_the_field(sim: Simulator, case: str) -> None:
    doc = sim.release_doc()
    MALFORMED[case](doc)
    with pytest.raises(ManifestError) as info:
        parse_manifest(dumps(doc))
    assert info.value.code == "malformed"
    assert info.value.message.startswith("manifest")


@pytest.mark.parametrize("payload", [b"", b"[]", b"nul", b"\xff\xfe", b'{"type": "trust"}'])
def test_non_manifest_payloads(payload: bytes) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(payload)
    assert info.value.code == "malformed"


@pytest.mark.parametrize("form", [_DELETE, 1, 3, "2", True])
def test_a_release_of_another_format_is_unsupported(sim: Simulator, form) -> None:
    """A release format 1 manifest (no format, no serial) is refused with its own code."""
    doc = sim.release_doc()
    _set("format", form)(doc)
    with pytest.raises(ManifestError) as info:
        parse_manifest(dumps(doc))
    assert info.value.code == "unsupported_format"


@pytest.mark.parametrize("serial", [_DELETE, 0, -1, 2**53, True, "3", 1.5])
def test_the_serial_is_a_positive_integer(sim: Simulator, serial) -> None:
    doc = sim.release_doc()
    _set("serial", serial)(doc)
    with pytest.raises(ManifestError) as info:
        parse_manifest(dumps(doc))
    assert info.value.code == "malformed"


def check(
    sim: Simulator,
    *,
    now=NOW,
    device=DEVICE,
    floor=None,
    bad=(),
    limit=1 << 20,
    serial_floor=None,
    **doc,
):
    manifest = parse_manifest(dumps(sim.release_doc(**doc)))
    check_release(
        manifest,
        now=now,
        device=device,
        floor=floor,
        bad_versions=set(bad),
        max_artifact_bytes=limit,
        serial_floor=serial_floor,
    )


def refused(code: str, sim: Simulator, **kwargs) -> Refused:
    with pytest.raises(Refused) as info:
        check(sim, **kwargs)
    assert info.value.code == code, info.value
    return info.value


def test_a_fresh_newer_release_for_this_device_passes(sim: Simulator) -> None:
    check(sim, floor="1")
    check(sim, floor=None)
    check(sim, version="1.10.0", floor="1.9.5")  # numeric, not string, order


def test_expired(sim: Simulator) -> None:
    error = refused("expired", sim, now=NOW + timedelta(days=8))
    assert "digits 2" in error.message


def test_not_yet_valid_beyond_the_clock_skew(sim: Simulator) -> None:
    refused("not_yet_valid", sim, issued_at=format_time(NOW + timedelta(minutes=10)))
    check(sim, issued_at=format_time(NOW + timedelta(minutes=4)))  # within 5 min skew


@pytest.mark.parametrize(
    "targets",
    [{"profiles": ["rpi5"]}, {"device_classes": ["jetson"]}, {"device_ids": ["dev-002"]}],
)
def test_wrong_target(sim: Simulator, targets: dict) -> None:
    error = refused("wrong_target", sim, targets=targets)
    assert next(iter(targets)) in error.message


def test_every_target_criterion_must_match(sim: Simulator) -> None:
    ok = {"profiles": ["generic_x86_64"], "device_classes": ["x86", "arm"], "device_ids": []}
    check(sim, targets=ok)
    refused("wrong_target", sim, targets={**ok, "device_ids": ["other"]})


def test_agent_too_old(sim: Simulator) -> None:
    refused("agent_too_old", sim, min_agent_version="0.2.0")
    check(sim, device=replace(DEVICE, agent_version="0.10.0"), min_agent_version="0.9")


def test_known_bad_version(sim: Simulator) -> None:
    refused("known_bad", sim, bad={"2.0.0"})  # "2" and "2.0.0" are the same version


def test_rollback_and_same_version(sim: Simulator) -> None:
    refused("rollback", sim, floor="3")
    refused("rollback", sim, version="1.9.0", floor="1.10.0")
    error = refused("same_version", sim, floor="2.0")
    assert "already installed" in error.message


def test_once_a_serial_is_committed_the_serial_is_the_floor(sim: Simulator) -> None:
    """An older model version with a higher serial is a signed rollback: it passes, whatever
    the version floor says; a lower serial is a replay, an equal one a re-delivery."""
    check(sim, version="1", serial=5, serial_floor=4, floor="3")
    error = refused("replay", sim, version="9", serial=3, serial_floor=4)
    assert "serial 3 is below serial 4" in error.message
    refused("same_version", sim, serial=4, serial_floor=4)
    refused("known_bad", sim, serial=5, serial_floor=4, bad=["2"])


def test_artifact_too_large(sim: Simulator) -> None:
    error = refused("too_large", sim, limit=4095)
    assert "max_artifact_bytes" in error.message
    check(sim, limit=4096)


def test_a_variant_artifact_over_the_limit_is_too_large(sim: Simulator) -> None:
    big = {**_VARIANT, "size": 8192}
    error = refused("too_large", sim, limit=4096, variants=[big])
    assert "digits-2.onnxruntime.int8.tar.gz is 8192 bytes" in error.message


def test_nesting_deeper_than_the_bound_is_malformed_not_a_recursion_error() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(b"[" * 5000 + b"]" * 5000)
    assert "nested deeper" in info.value.message
