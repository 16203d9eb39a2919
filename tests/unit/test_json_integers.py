"""A JSON integer longer than Python converts is a named refusal, never a stray ValueError.

Python refuses ``int()`` of more than ``sys.get_int_max_str_digits()`` digits (4,300) with a
plain ValueError; before ``loads_strict`` caught it, one such number in an unsigned MQTT
envelope escaped every ``except TrustError`` and stopped the device's update worker (issue 23,
like its finding 12). The envelope decoder, the trust and manifest payload parsers and the
hub's report parser all go through ``loads_strict``.
"""

from __future__ import annotations

import sys

import pytest

from edgeagent.fleet.messages import MessageError, decode_state
from edgeagent.fleet.signing import VerificationError, decode_envelope

LIMIT = sys.get_int_max_str_digits() or 4300  # 0 means unlimited: still test the usual size
TOO_LONG = "9" * (LIMIT + 1)

HOSTILE = {
    "as the payload": f'{{"payload": {TOO_LONG}, "signatures": []}}',
    "negative": f'{{"payload": -{TOO_LONG}, "signatures": []}}',
    "inside a signature": f'{{"payload": "eA==", "signatures": [{{"keyid": {TOO_LONG}}}]}}',
    "an extra field": f'{{"x": {TOO_LONG}, "payload": "eA==", "signatures": []}}',
    "deep in a list": f'{{"payload": [[[{TOO_LONG}]]], "signatures": []}}',
    "a bare number": TOO_LONG,
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_an_over_long_integer_is_a_malformed_envelope(case: str) -> None:
    data = HOSTILE[case].encode()
    with pytest.raises(VerificationError) as info:
        decode_envelope(data, max_bytes=len(data) + 1)
    assert info.value.code == "malformed"
    assert info.value.message.startswith("envelope: an integer of")
    assert "too long" in info.value.message


def test_an_integer_python_still_converts_reaches_the_shape_check() -> None:
    data = f'{{"payload": {"9" * LIMIT}, "signatures": []}}'.encode()
    with pytest.raises(VerificationError) as info:
        decode_envelope(data, max_bytes=len(data) + 1)
    assert info.value.code == "malformed"
    assert "payload: must be a base64 string" in info.value.message


def test_a_device_report_with_one_is_refused_naming_it() -> None:
    with pytest.raises(MessageError) as info:
        decode_state(f'{{"schema": 1, "uptime_s": {TOO_LONG}}}'.encode())
    assert "integer of" in str(info.value)
