"""Envelopes: the exact bytes are signed, every malformed shape gets a clear ``malformed``."""

from __future__ import annotations

import base64
import json

import pytest

from edgeagent.fleet.signing import (
    Envelope,
    Signature,
    VerificationError,
    check_threshold,
    decode_envelope,
    encode_envelope,
    format_time,
    parse_time,
)
from tests.unit.test_trust_sim import Simulator

LIMIT = 64 * 1024


@pytest.fixture
def sim() -> Simulator:
    return Simulator()


def keys_of(sim: Simulator, *names: str) -> dict:
    return {sim.keyid(n): sim.key(n).public_key() for n in names}


def check(sim: Simulator, data: bytes, *, authorised=("a",), threshold=1) -> set[str]:
    envelope = decode_envelope(data, max_bytes=LIMIT)
    return check_threshold(
        envelope,
        keys=keys_of(sim, "a", "b", "c"),
        authorised={sim.keyid(n) for n in authorised},
        threshold=threshold,
        role="release",
    )


def test_round_trip_keeps_the_raw_payload_bytes(sim: Simulator) -> None:
    payload = b'{"b": 1,  "a": "\xc3\xa9"}'  # odd spacing and key order must survive as-is
    envelope = decode_envelope(sim.sign(payload, "a"), max_bytes=LIMIT)
    assert envelope.payload == payload
    assert [s.keyid for s in envelope.signatures] == [sim.keyid("a")]
    assert check(sim, sim.sign(payload, "a")) == {sim.keyid("a")}


def test_one_signature_per_key_even_if_the_signer_repeats_it(sim: Simulator) -> None:
    envelope = decode_envelope(sim.sign(b"x", "a", "a"), max_bytes=LIMIT)
    assert len(envelope.signatures) == 1


def test_tampered_payload_is_a_bad_signature(sim: Simulator) -> None:
    document = json.loads(sim.sign(b'{"version": 2}', "a"))
    document["payload"] = base64.b64encode(b'{"version": 9}').decode()
    with pytest.raises(VerificationError) as info:
        check(sim, json.dumps(document).encode())
    assert info.value.code == "bad_signature"


def test_truncated_signature_is_a_bad_signature(sim: Simulator) -> None:
    document = json.loads(sim.sign(b"x", "a"))
    sig = base64.b64decode(document["signatures"][0]["sig"])
    document["signatures"][0]["sig"] = base64.b64encode(sig[:40]).decode()
    with pytest.raises(VerificationError) as info:
        check(sim, json.dumps(document).encode())
    assert info.value.code == "bad_signature"


def test_key_outside_the_role_is_unknown(sim: Simulator) -> None:
    with pytest.raises(VerificationError) as info:
        check(sim, sim.sign(b"x", "b"))
    assert info.value.code == "unknown_key"
    assert sim.keyid("b")[:12] in info.value.message


def test_duplicate_signatures_count_once(sim: Simulator) -> None:
    signature = sim.key("a").sign(b"x")
    twice = Envelope(b"x", (Signature(sim.keyid("a"), signature),) * 2)
    with pytest.raises(VerificationError) as info:
        check(sim, encode_envelope(twice), authorised=("a", "b"), threshold=2)
    assert info.value.code == "below_threshold"
    assert "1 valid release signature(s), 2 needed" in info.value.message


def test_threshold_met_ignores_extra_foreign_and_bad_signatures(sim: Simulator) -> None:
    good = decode_envelope(sim.sign(b"x", "a", "b", "c"), max_bytes=LIMIT)
    broken = Signature(good.signatures[2].keyid, b"\0" * 64)
    envelope = Envelope(b"x", (*good.signatures[:2], broken))
    valid = check(sim, encode_envelope(envelope), authorised=("a", "b", "c"), threshold=2)
    assert valid == {sim.keyid("a"), sim.keyid("b")}


def test_bad_signature_outranks_unknown_key_in_the_reason(sim: Simulator) -> None:
    good = decode_envelope(sim.sign(b"x", "a", "b"), max_bytes=LIMIT)
    envelope = Envelope(b"x", (Signature(good.signatures[0].keyid, b"\1" * 64), good.signatures[1]))
    with pytest.raises(VerificationError) as info:
        check(sim, encode_envelope(envelope), authorised=("a",))
    assert info.value.code == "bad_signature"


def test_too_large_is_refused_before_parsing() -> None:
    with pytest.raises(VerificationError) as info:
        decode_envelope(b"{" * (LIMIT + 1), max_bytes=LIMIT)
    assert info.value.code == "too_large"


def good_document(sim: Simulator) -> dict:
    return json.loads(sim.sign(b"payload", "a"))


MALFORMED = {
    "not json": lambda d: b"{not json",
    "not utf-8": lambda d: b'{"payload": "\xff"}',
    "a list": lambda d: b"[]",
    "extra field": lambda d: {**d, "extra": 1},
    "no signatures field": lambda d: {"payload": d["payload"]},
    "empty signatures": lambda d: {**d, "signatures": []},
    "signatures not a list": lambda d: {**d, "signatures": {}},
    "payload not base64": lambda d: {**d, "payload": "***"},
    "payload not a string": lambda d: {**d, "payload": 5},
    "sig not base64": lambda d: {**d, "signatures": [{**d["signatures"][0], "sig": "%%"}]},
    "keyid not hex": lambda d: {**d, "signatures": [{**d["signatures"][0], "keyid": "zz"}]},
    "keyid upper case": lambda d: {
        **d,
        "signatures": [{**d["signatures"][0], "keyid": d["signatures"][0]["keyid"].upper()}],
    },
    "signature entry extra field": lambda d: {
        **d,
        "signatures": [{**d["signatures"][0], "by": "me"}],
    },
    "duplicate json key": lambda d: b'{"payload": "eA==", "payload": "eQ==", "signatures": []}',
    "NaN": lambda d: b'{"payload": NaN, "signatures": []}',
    "deep nesting": lambda d: b"[" * 100000 + b"]" * 100000,
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_envelopes_are_named(sim: Simulator, case: str) -> None:
    changed = MALFORMED[case](good_document(sim))
    data = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
    with pytest.raises(VerificationError) as info:
        decode_envelope(data, max_bytes=len(data) + 1)
    assert info.value.code == "malformed"
    assert info.value.message.startswith("envelope")


def test_times_need_a_zone_and_round_trip() -> None:
    moment = parse_time("2026-06-01T12:00:00Z", "t")
    assert format_time(moment) == "2026-06-01T12:00:00Z"
    assert parse_time("2026-06-01T14:00:00+02:00", "t") == moment
    for bad in ("2026-06-01T12:00:00", "yesterday", 5):
        with pytest.raises(VerificationError) as info:
            parse_time(bad, "manifest expires")
        assert info.value.code == "malformed"
        assert "manifest expires" in info.value.message
