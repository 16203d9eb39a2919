"""``verify_release``: the whole pre-download check against every row of the threat model.

Each case signs a release with one thing changed and asserts the error code *and* that the
trusted state on disk (trust file, verified time) did not move; a success moves only the
verified time, and only forwards.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from edgeagent.fleet.manifest import ReleaseManifest, ReleaseRefused, verify_release
from edgeagent.fleet.signing import Refused, TrustError, format_time
from edgeagent.fleet.trust import TrustStore
from tests.unit.test_trust_sim import DEVICE, NOW, History, Simulator, snapshot


@pytest.fixture
def sim() -> Simulator:
    return Simulator()


@pytest.fixture
def trust(sim: Simulator, tmp_path: Path) -> TrustStore:
    doc = sim.trust_doc(release=("release", "release2"))
    return TrustStore.load(sim.write_trust(tmp_path / "trust.json", doc), max_bytes=4096)


def verify(
    trust: TrustStore, envelope: bytes, *, now: datetime = NOW, history: History | None = None
) -> ReleaseManifest:
    return verify_release(
        envelope,
        trust,
        device=DEVICE,
        history=history or History(floors={"digits": "1"}, bad={"digits": {"3"}}),
        max_artifact_bytes=1 << 20,
        now=now,
    )


def tampered(envelope: bytes) -> bytes:
    document = json.loads(envelope)
    document["payload"] = document["payload"][:-4] + "AAA="
    return json.dumps(document).encode()


def release(sim: Simulator, *signers: str, **changes) -> bytes:
    return sim.sign(sim.release_doc(**changes), *(signers or ("release",)))


ATTACKS = {
    "tampered payload": ("bad_signature", lambda s: tampered(release(s))),
    "wrong key": ("unknown_key", lambda s: release(s, "attacker")),
    "root key for a release": ("unknown_key", lambda s: release(s, "root")),
    "malformed JSON payload": ("malformed", lambda s: s.sign(b"{oops", "release")),
    "malformed field": ("malformed", lambda s: release(s, version="v2")),
    "malformed envelope": ("malformed", lambda s: b'{"payload": "!!", "signatures": []}'),
    "oversized envelope": ("too_large", lambda s: release(s, deployment_id="d" * 5000)),
    "replayed older version": ("rollback", lambda s: release(s, version="0.9")),
    "equal version": ("same_version", lambda s: release(s, version="1")),
    "known bad version": ("known_bad", lambda s: release(s, version="3")),
    "expired": (
        "expired",
        lambda s: release(
            s,
            issued_at=format_time(NOW - timedelta(days=8)),
            expires=format_time(NOW - timedelta(hours=1)),
        ),
    ),
    "issued in the future": (
        "not_yet_valid",
        lambda s: release(s, issued_at=format_time(NOW + timedelta(hours=1))),
    ),
    "wrong target": ("wrong_target", lambda s: release(s, targets={"device_classes": ["rk3588"]})),
    "oversized artifact": (
        "too_large",
        lambda s: release(
            s, artifact={"url": "http://h/a.tgz", "size": (1 << 20) + 1, "sha256": "ab" * 32}
        ),
    ),
    "agent too old": ("agent_too_old", lambda s: release(s, min_agent_version="9.0.0")),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attacks_are_refused_and_change_nothing(sim, trust, tmp_path: Path, attack: str) -> None:
    code, build = ATTACKS[attack]
    trust.record_verified(NOW - timedelta(days=1))
    before = snapshot(tmp_path)
    with pytest.raises(TrustError) as info:
        verify(trust, build(sim))
    assert info.value.code == code, info.value
    assert snapshot(tmp_path) == before
    if isinstance(info.value, Refused):  # authentic: reported with what it was
        assert isinstance(info.value, ReleaseRefused)
        assert info.value.manifest.deployment_id == "dep-1"


def test_good_release_verifies_and_moves_the_verified_time(sim, trust) -> None:
    manifest = verify(trust, release(sim))
    assert (manifest.model, manifest.version) == ("digits", "2")
    assert trust.last_verified() == manifest.issued_at


def test_any_release_key_counts_once_toward_the_threshold(sim, trust) -> None:
    assert verify(trust, release(sim, "release2")).version == "2"


def test_a_clock_behind_the_verified_time_is_treated_as_that_time(sim, trust) -> None:
    """Freeze attack: an RTC reset to 2020 must not revive a release that has expired."""
    trust.record_verified(NOW)
    stale = release(sim, issued_at="2020-01-01T00:00:00Z", expires="2020-02-01T00:00:00Z")
    with pytest.raises(TrustError) as info:
        verify(trust, stale, now=datetime.fromisoformat("2020-01-15T00:00:00+00:00"))
    assert info.value.code == "expired"


def test_a_release_issued_before_the_verified_time_is_still_accepted(sim, trust) -> None:
    trust.record_verified(NOW + timedelta(hours=1))
    manifest = verify(trust, release(sim))
    assert manifest.issued_at < NOW
    assert trust.last_verified() == NOW + timedelta(hours=1)  # never moves back


def test_expired_trust_file_stops_releases(sim: Simulator, tmp_path: Path) -> None:
    doc = sim.trust_doc(expires=NOW - timedelta(days=1))
    trust = TrustStore.load(sim.write_trust(tmp_path / "old.json", doc))
    with pytest.raises(TrustError) as info:
        verify(trust, release(sim))
    assert info.value.code == "expired"
    assert "trust file v1" in info.value.message


def test_first_install_has_no_floor(sim, trust) -> None:
    manifest = verify(trust, release(sim, version="0.1"), history=History())
    assert manifest.version == "0.1"
