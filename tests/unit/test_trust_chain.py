"""``TrustStore.update``: a device that slept through rotations catches up from one message."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from edgeagent.fleet.signing import TrustError
from edgeagent.fleet.trust import MAX_CHAIN, TrustStore
from tests.unit.test_trust_sim import NOW, Simulator, snapshot


@pytest.fixture
def sim() -> Simulator:
    return Simulator()


def chain(sim: Simulator, last: int) -> list[bytes]:
    """Trust v2..v<last>, each rotating to a fresh root key signed by the previous one."""
    envelopes = []
    for version in range(2, last + 1):
        previous = "root" if version == 2 else f"root{version - 1}"
        doc = sim.trust_doc(version=version, root=(f"root{version}",))
        envelopes.append(sim.sign(doc, previous, f"root{version}"))
    return envelopes


def bundle(*envelopes: bytes) -> bytes:
    return json.dumps([json.loads(e) for e in envelopes]).encode()


@pytest.fixture
def store(sim: Simulator, tmp_path: Path) -> TrustStore:
    return TrustStore.load(sim.write_trust(tmp_path / "trust.json", sim.trust_doc()))


def test_single_envelope_is_one_rotation(sim: Simulator, store: TrustStore) -> None:
    assert store.update(chain(sim, 2)[0], now=NOW).version == 2


def test_a_chain_is_walked_in_version_order(sim: Simulator, store: TrustStore) -> None:
    v2, v3, v4 = chain(sim, 4)
    updated = store.update(bundle(v3, v4, v2), now=NOW)
    assert updated.version == 4
    assert TrustStore.load(store.path).root.roles["root"].keyids == {sim.keyid("root4")}


def test_versions_already_trusted_are_skipped(sim: Simulator, store: TrustStore) -> None:
    v2, v3 = chain(sim, 3)
    at_v2 = store.update(v2, now=NOW)
    assert at_v2.update(bundle(v2, v3), now=NOW).version == 3


def test_nothing_newer_is_same_version(sim: Simulator, store: TrustStore, tmp_path) -> None:
    v2 = chain(sim, 2)[0]
    at_v2 = store.update(v2, now=NOW)
    before = snapshot(tmp_path)
    with pytest.raises(TrustError) as info:
        at_v2.update(bundle(v2), now=NOW)
    assert info.value.code == "same_version"
    assert snapshot(tmp_path) == before


def test_a_forged_link_refuses_the_whole_chain(sim, store, tmp_path) -> None:
    """All or nothing: the good v2 before a forged v3 is not applied either, so the store
    (on disk and in memory) stays at v1 and the genuine chain still applies afterwards."""
    v2, v3 = chain(sim, 3)
    forged_v3 = sim.sign(sim.trust_doc(version=3, root=("attacker",)), "attacker")
    before = snapshot(tmp_path)
    with pytest.raises(TrustError) as info:
        store.update(bundle(v2, forged_v3), now=NOW)
    assert info.value.code == "unknown_key"
    assert snapshot(tmp_path) == before
    assert store.update(bundle(v2, v3), now=NOW).version == 3


def test_a_duplicated_link_refuses_the_whole_chain(sim, store, tmp_path) -> None:
    v2, v3 = chain(sim, 3)
    before = snapshot(tmp_path)
    with pytest.raises(TrustError) as info:
        store.update(bundle(v2, v2, v3), now=NOW)
    assert info.value.code == "same_version"
    assert snapshot(tmp_path) == before
    assert store.update(bundle(v2, v3), now=NOW).version == 3


def test_a_deeply_nested_unsigned_payload_is_refused(store: TrustStore, tmp_path) -> None:
    """Bytes nobody signed never reach an unbounded parser: no RecursionError, just the
    signature refusal."""
    payload = base64.b64encode(b"[" * 5000 + b"]" * 5000).decode()
    signature = {"keyid": "0" * 64, "sig": base64.b64encode(b"x" * 64).decode()}
    deep = json.dumps({"payload": payload, "signatures": [signature]}).encode()
    before = snapshot(tmp_path)
    with pytest.raises(TrustError) as info:
        store.update(deep, now=NOW)
    assert info.value.code == "unknown_key"
    assert snapshot(tmp_path) == before


def test_a_missing_link_is_a_version_gap(sim, store, tmp_path) -> None:
    _, v3, v4 = chain(sim, 4)
    before = snapshot(tmp_path)
    with pytest.raises(TrustError) as info:
        store.update(bundle(v3, v4), now=NOW)
    assert info.value.code == "version_gap"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("message", [b"[]", b"[1, 2]", b"[{}]", b"[oops"])
def test_malformed_chains(store: TrustStore, tmp_path: Path, message: bytes) -> None:
    before = snapshot(tmp_path)
    with pytest.raises(TrustError) as info:
        store.update(message, now=NOW)
    assert info.value.code == "malformed"
    assert snapshot(tmp_path) == before


def test_oversized_chain(store: TrustStore) -> None:
    with pytest.raises(TrustError) as info:
        store.update(b"[" + b" " * (store.max_bytes * MAX_CHAIN) + b"]", now=NOW)
    assert info.value.code == "too_large"
