"""Trust store: loading, role verification and signed rotation, each attack changing one thing.

Every refusal is checked twice, python-tuf style: the specific error code, and that the trusted
state on disk (trust file and verified time) is byte-for-byte what it was.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from edgeagent.config import parse_config
from edgeagent.fleet.signing import Refused, TrustError, VerificationError
from edgeagent.fleet.trust import TrustStore, open_trust_store, trust_state_path
from edgeagent.sections import ConfigError
from tests.unit.test_trust_sim import NOW, Simulator, snapshot


@pytest.fixture
def sim() -> Simulator:
    return Simulator()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def store(sim: Simulator, state: Path) -> TrustStore:
    sim.write_trust(state / "trust.json", sim.trust_doc())
    return TrustStore.load(state / "trust.json")


def refused(state: Path, code: str, action) -> TrustError:
    """Run ``action``, expect ``code``, and prove the state directory did not change."""
    before = snapshot(state)
    with pytest.raises(TrustError) as info:
        action()
    assert info.value.code == code, info.value
    assert snapshot(state) == before
    return info.value


# --- loading ------------------------------------------------------------------------------


def test_load_reads_keys_and_roles(sim: Simulator, store: TrustStore) -> None:
    assert store.version == 1
    assert store.expires == NOW + timedelta(days=365)
    assert store.root.roles["root"].keyids == {sim.keyid("root")}
    assert store.root.roles["release"].keyids == {sim.keyid("release")}


def test_missing_trust_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(TrustError) as info:
        TrustStore.load(tmp_path / "nope.json")
    assert info.value.code == "no_trust"
    assert "nope.json" in info.value.message


def test_trust_file_not_signed_by_its_own_root_is_refused(sim: Simulator, state: Path) -> None:
    path = sim.write_trust(state / "trust.json", sim.trust_doc(), "release")
    error = refused(state, "unknown_key", lambda: TrustStore.load(path))
    assert str(path) in error.message


def test_trust_file_below_its_root_threshold_is_refused(sim: Simulator, state: Path) -> None:
    doc = sim.trust_doc(root=("root", "root2"), root_threshold=2)
    path = sim.write_trust(state / "trust.json", doc, "root")
    refused(state, "below_threshold", lambda: TrustStore.load(path))


def test_oversized_trust_file_is_refused_unread(sim: Simulator, state: Path) -> None:
    path = sim.write_trust(state / "trust.json", sim.trust_doc())
    refused(state, "too_large", lambda: TrustStore.load(path, max_bytes=100))


def _key_id_mismatch(sim: Simulator, doc: dict) -> None:
    doc["keys"][sim.keyid("release")] = doc["keys"][sim.keyid("root")]


TRUST_MALFORMED = {
    "wrong type": lambda sim, d: d.update(type="release"),
    "version zero": lambda sim, d: d.update(version=0),
    "version bool": lambda sim, d: d.update(version=True),
    "naive expiry": lambda sim, d: d.update(expires="2027-01-01T00:00:00"),
    "extra field": lambda sim, d: d.update(comment="hi"),
    "no keys": lambda sim, d: d.update(keys={}),
    "short key": lambda sim, d: d["keys"][sim.keyid("root")].update(ed25519="abcd"),
    "key id mismatch": _key_id_mismatch,
    "threshold above keys": lambda sim, d: d["roles"]["release"].update(threshold=2),
    "threshold zero": lambda sim, d: d["roles"]["root"].update(threshold=0),
    "role key not listed": lambda sim, d: d["roles"]["release"]["keyids"].append("ab" * 32),
    "duplicate role key": lambda sim, d: d["roles"]["root"]["keyids"].append(sim.keyid("root")),
    "missing role": lambda sim, d: d["roles"].pop("release"),
    "extra role": lambda sim, d: d["roles"].update(admin=d["roles"]["root"]),
    "floor reset not an object": lambda sim, d: d.update(floor_resets=["tiny"]),
    "floor reset bad model": lambda sim, d: d.update(floor_resets={"tiny\n": "1"}),
    "floor reset int version": lambda sim, d: d.update(floor_resets={"tiny": 1}),
    "floor reset long version": lambda sim, d: d.update(floor_resets={"tiny": "1" * 256}),
}


@pytest.mark.parametrize("case", sorted(TRUST_MALFORMED))
def test_malformed_trust_payloads_are_named(sim: Simulator, state: Path, case: str) -> None:
    doc = sim.trust_doc()
    TRUST_MALFORMED[case](sim, doc)
    path = sim.write_trust(state / "trust.json", doc)
    error = refused(state, "malformed", lambda: TrustStore.load(path))
    assert error.message.startswith(str(path))


def test_seed_initialises_the_state_copy(sim: Simulator, tmp_path: Path) -> None:
    seed = sim.write_trust(tmp_path / "etc" / "trust.json", sim.trust_doc())
    store = open_trust_store(tmp_path / "state", seed=seed, max_bytes=65536)
    assert store.path == trust_state_path(tmp_path / "state")
    assert store.path.read_bytes() == seed.read_bytes()


def test_seed_with_a_higher_version_replaces_the_state_copy(sim: Simulator, tmp_path: Path) -> None:
    live = sim.write_trust(tmp_path / "state" / "trust.json", sim.trust_doc(version=2))
    old_seed = sim.write_trust(tmp_path / "seed1.json", sim.trust_doc(version=1))
    assert TrustStore.load(live, seed=old_seed).version == 2  # a stale seed never wins
    new_seed = sim.write_trust(tmp_path / "seed3.json", sim.trust_doc(version=3))
    assert TrustStore.load(live, seed=new_seed).version == 3
    assert TrustStore.load(live).version == 3


def test_corrupt_seed_is_refused_even_with_a_good_state_copy(sim: Simulator, tmp_path: Path):
    live = sim.write_trust(tmp_path / "state" / "trust.json", sim.trust_doc())
    seed = tmp_path / "seed.json"
    seed.write_bytes(b"{}")
    with pytest.raises(VerificationError) as info:
        TrustStore.load(live, seed=seed)
    assert info.value.code == "malformed"


# --- verify -------------------------------------------------------------------------------


def test_release_signed_by_the_release_key_verifies(sim: Simulator, store: TrustStore) -> None:
    assert store.verify(sim.sign(b"payload", "release")) == b"payload"


def test_root_key_cannot_sign_a_release(sim: Simulator, store: TrustStore, state: Path) -> None:
    refused(state, "unknown_key", lambda: store.verify(sim.sign(b"payload", "root")))


def test_release_key_cannot_sign_for_root(sim: Simulator, store: TrustStore, state: Path) -> None:
    refused(state, "unknown_key", lambda: store.verify(sim.sign(b"x", "release"), "root"))


def test_release_threshold_needs_distinct_keys(sim: Simulator, state: Path) -> None:
    doc = sim.trust_doc(release=("r1", "r2", "r3"), release_threshold=2)
    store = TrustStore.load(sim.write_trust(state / "trust.json", doc))
    assert store.verify(sim.sign(b"x", "r1", "r3")) == b"x"
    refused(state, "below_threshold", lambda: store.verify(sim.sign(b"x", "r2", "r2")))
    refused(state, "below_threshold", lambda: store.verify(sim.sign(b"x", "r2", "stranger")))
    refused(state, "unknown_key", lambda: store.verify(sim.sign(b"x", "stranger")))


def test_unknown_role_is_a_programming_error(store: TrustStore) -> None:
    with pytest.raises(ValueError, match="unknown role"):
        store.verify(b"{}", "admin")


# --- rotation -----------------------------------------------------------------------------


def rotation_doc(sim: Simulator, version: int = 2, **kwargs) -> dict:
    kwargs.setdefault("root", ("root2",))
    kwargs.setdefault("release", ("release2",))
    return sim.trust_doc(version=version, **kwargs)


def test_good_rotation_persists_and_revokes_old_keys(sim: Simulator, store, state: Path) -> None:
    envelope = sim.sign(rotation_doc(sim), "root", "root2")
    rotated = store.rotate(envelope, now=NOW)
    assert rotated.version == 2
    assert store.path.read_bytes() == envelope
    reloaded = TrustStore.load(store.path)
    assert reloaded.version == 2
    assert reloaded.verify(sim.sign(b"x", "release2")) == b"x"
    refused(state, "unknown_key", lambda: reloaded.verify(sim.sign(b"x", "release")))


def test_a_rotation_carries_its_floor_resets(sim: Simulator, store) -> None:
    """Only a rotation's own (root-signed) resets are handed on; a loaded store has none."""
    doc = {**rotation_doc(sim), "floor_resets": {"tiny": "3"}}
    rotated = store.rotate(sim.sign(doc, "root", "root2"), now=NOW)
    assert rotated.floor_resets == {"tiny": "3"} and rotated.root.floor_resets == {"tiny": "3"}
    assert TrustStore.load(store.path).floor_resets == {}


def test_rotation_walks_one_version_at_a_time(sim: Simulator, store) -> None:
    v2 = store.rotate(sim.sign(rotation_doc(sim), "root", "root2"), now=NOW)
    v3_doc = rotation_doc(sim, 3, root=("root3",), release=("release3",))
    v3 = v2.rotate(sim.sign(v3_doc, "root2", "root3"), now=NOW)
    assert v3.version == 3
    assert TrustStore.load(store.path).root.roles["root"].keyids == {sim.keyid("root3")}


def test_rotation_signed_only_by_old_keys(sim: Simulator, store, state: Path) -> None:
    envelope = sim.sign(rotation_doc(sim), "root")
    refused(state, "unknown_key", lambda: store.rotate(envelope, now=NOW))


def test_rotation_signed_only_by_new_keys(sim: Simulator, store, state: Path) -> None:
    envelope = sim.sign(rotation_doc(sim), "root2")
    refused(state, "unknown_key", lambda: store.rotate(envelope, now=NOW))


def test_rotation_below_the_old_root_threshold(sim: Simulator, state: Path) -> None:
    doc = sim.trust_doc(root=("rootA", "rootB"), root_threshold=2)
    store = TrustStore.load(sim.write_trust(state / "trust.json", doc, "rootA", "rootB"))
    envelope = sim.sign(rotation_doc(sim), "rootA", "root2")
    refused(state, "below_threshold", lambda: store.rotate(envelope, now=NOW))


def test_rotation_below_its_own_root_threshold(sim: Simulator, store, state: Path) -> None:
    doc = rotation_doc(sim, root=("root2", "root3"), root_threshold=2)
    envelope = sim.sign(doc, "root", "root2")
    refused(state, "below_threshold", lambda: store.rotate(envelope, now=NOW))


def test_rotation_with_a_tampered_payload(sim: Simulator, store, state: Path) -> None:
    envelope = json.loads(sim.sign(rotation_doc(sim), "root", "root2"))
    forged = sim.sign(rotation_doc(sim, release=("attacker",)), "attacker")
    envelope["payload"] = json.loads(forged)["payload"]
    data = json.dumps(envelope).encode()
    refused(state, "bad_signature", lambda: store.rotate(data, now=NOW))


def test_rotation_skipping_a_version(sim: Simulator, store, state: Path) -> None:
    envelope = sim.sign(rotation_doc(sim, 3), "root", "root2")
    refused(state, "version_gap", lambda: store.rotate(envelope, now=NOW))


def test_replayed_current_version(sim: Simulator, store, state: Path) -> None:
    envelope = sim.sign(rotation_doc(sim, 1), "root", "root2")
    refused(state, "same_version", lambda: store.rotate(envelope, now=NOW))


def test_replayed_older_root_with_unchanged_keys(sim: Simulator, store, state: Path) -> None:
    v1 = store.path.read_bytes()
    v2 = store.rotate(sim.sign(sim.trust_doc(version=2), "root"), now=NOW)
    refused(state, "rollback", lambda: v2.rotate(v1, now=NOW))


def test_replayed_older_root_after_key_rotation(sim: Simulator, store, state: Path) -> None:
    v1 = store.path.read_bytes()
    v2 = store.rotate(sim.sign(rotation_doc(sim), "root", "root2"), now=NOW)
    refused(state, "unknown_key", lambda: v2.rotate(v1, now=NOW))


def test_expired_rotation(sim: Simulator, store, state: Path) -> None:
    doc = rotation_doc(sim, expires=NOW - timedelta(seconds=1))
    envelope = sim.sign(doc, "root", "root2")
    refused(state, "expired", lambda: store.rotate(envelope, now=NOW))


def test_rotation_expiry_uses_the_verified_time(sim: Simulator, store, state: Path) -> None:
    store.record_verified(NOW + timedelta(days=30))
    doc = rotation_doc(sim, expires=NOW + timedelta(days=10))
    envelope = sim.sign(doc, "root", "root2")
    refused(state, "expired", lambda: store.rotate(envelope, now=NOW))


def test_a_release_envelope_is_not_a_trust_file(sim: Simulator, store, state: Path) -> None:
    envelope = sim.sign(sim.release_doc(), "root")
    refused(state, "malformed", lambda: store.rotate(envelope, now=NOW))


def test_rotation_that_cannot_be_written_leaves_the_old_file(
    sim: Simulator, store, state, monkeypatch
):
    before = snapshot(state)

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("edgeagent.fsutil.os.replace", fail)
    with pytest.raises(OSError):
        store.rotate(sim.sign(rotation_doc(sim), "root", "root2"), now=NOW)
    assert snapshot(state) == before  # no temporary file left either


def test_verified_time_that_cannot_be_synced_is_not_half_written(store, state, monkeypatch):
    store.record_verified(NOW)
    before = snapshot(state)

    def fail(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("edgeagent.fsutil.os.fsync", fail)
    with pytest.raises(OSError):
        store.record_verified(NOW + timedelta(hours=1))
    assert snapshot(state) == before
    assert store.last_verified() == NOW


# --- verified time ------------------------------------------------------------------------


def test_verified_time_only_moves_forward(store: TrustStore) -> None:
    assert store.last_verified() is None
    assert store.effective_now(NOW) == NOW
    store.record_verified(NOW + timedelta(hours=1))
    store.record_verified(NOW)  # older: ignored
    assert store.last_verified() == NOW + timedelta(hours=1)
    assert store.effective_now(NOW) == NOW + timedelta(hours=1)
    assert store.effective_now(NOW + timedelta(hours=2)) == NOW + timedelta(hours=2)


def test_corrupt_verified_time_is_reported(store: TrustStore) -> None:
    store.clock_path.write_text("{}")
    with pytest.raises(TrustError) as info:
        store.effective_now(NOW)
    assert info.value.code == "corrupt_state"
    assert str(store.clock_path) in info.value.message


def test_refusals_are_typed(sim: Simulator, store) -> None:
    with pytest.raises(Refused):
        store.rotate(sim.sign(rotation_doc(sim, 3), "root", "root2"), now=NOW)


# --- config -------------------------------------------------------------------------------


def test_trust_settings_are_config_keys_with_defaults() -> None:
    updates = parse_config("").updates
    assert updates.trust_file == Path("/etc/edgeagent/trust.json")
    assert (updates.max_manifest_bytes, updates.clock_skew_s) == (65536, 300.0)
    custom = parse_config('[updates]\ntrust_file = "/x/t.json"\nclock_skew_s = 0\n').updates
    assert (custom.trust_file, custom.clock_skew_s) == (Path("/x/t.json"), 0.0)
    for bad, key in (
        ("max_manifest_bytes = 0", "max_manifest_bytes"),
        ("clock_skew_s = -1", "clock_skew_s"),
    ):
        with pytest.raises(ConfigError, match=rf"\[updates\] {key}"):
            parse_config(f"[updates]\n{bad}\n")


def test_a_stale_store_object_cannot_rotate_twice(sim: Simulator, store, state: Path) -> None:
    store.rotate(sim.sign(rotation_doc(sim), "root", "root2"), now=NOW)
    other_v2 = sim.sign(rotation_doc(sim, release=("release3",)), "root", "root2")
    refused(state, "stale_store", lambda: store.rotate(other_v2, now=NOW))
