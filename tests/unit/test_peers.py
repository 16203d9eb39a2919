"""The parts of a peer that need no server: [[peer]] settings, the wire codec's refusals, the
back-off of a failed peer, and the device gate leaving peers to their own governor."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from edgeagent.config import parse_config
from edgeagent.engine.gate import DeviceGate
from edgeagent.engine.limits import ServingLimits
from edgeagent.runtimes.base import InferenceError, TensorInfo
from edgeagent.runtimes.oip_codec import WireError, decode_response, encode_request
from edgeagent.runtimes.remote import (
    PeerLink,
    PeerState,
    RemoteSession,
    conform,
)
from edgeagent.sections import ConfigError
from tests.support.helpers import REPO

HOT = ServingLimits(max_concurrency=1, duty_cycle=0.05, reason="hot: test")
LOGITS = [TensorInfo("logits", "float32", (-1, 4))]


def test_peer_tables_parse_and_bad_ones_are_named() -> None:
    config = parse_config(
        '[[peer]]\nurl = "https://10.0.0.2:8443"\ntoken = "t"\nmodels = ["tiny"]\n'
        'fingerprint = "' + ":".join(["ab"] * 32) + '"\n'
        '[[peer]]\nurl = "http://127.0.0.1:8081"\nname = "bench"\n'
    )
    assert [p.label for p in config.peers] == ["10.0.0.2:8443", "bench"]
    assert config.peers[0].models == ["tiny"] and config.peers[1].models == []
    assert parse_config("").peers == ()
    bad = {
        'url = "ftp://x"': r"\[peer\] url: must be http",
        'url = "http://10.0.0.2:80"\ntoken = "t"': r"\[peer\] token: would cross the network",
        'url = "http://127.0.0.1:1"\nfingerprint = "' + "a" * 64 + '"': r"fingerprint: pins",
        'url = "https://h:1"\nfingerprint = "xyz"': r"fingerprint: must be a SHA-256",
        'url = "https://h:1"\ncert_file = "c.pem"': r"cert_file and key_file go together",
        'url = "https://h:1"\nconcurrency = 0': r"concurrency: must be between",
        'url = "https://h:1"\nlatency_budget_ms = 0': r"latency_budget_ms: must be positive",
        'url = "https://h:1"\nreprobe_backoff_max_s = 0.5': r"reprobe_backoff_max_s",
        'url = "https://h:1"\nurls = 1': r"unknown key\(s\) urls \(did you mean url\?\)",
    }
    for table, problem in bad.items():
        with pytest.raises(ConfigError, match=problem):
            parse_config(f"[[peer]]\n{table}\n")
    with pytest.raises(ConfigError, match="two peers are named a"):
        parse_config('[[peer]]\nurl = "http://127.0.0.1:1"\nname = "a"\n' * 2)
    with pytest.raises(ConfigError, match=r"\[\[peer\]\] must be an array of tables"):
        parse_config('[peer]\nurl = "http://127.0.0.1:1"\n')


def decode(body: bytes, header: str | None) -> dict[str, np.ndarray]:
    return decode_response(body, header).outputs


def test_the_codec_round_trips_binary_and_json_answers() -> None:
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    body, length = encode_request({"input": x})
    assert length is not None
    head = body[:length].decode()
    assert '"binary_data_size":48' in head and '"binary_data_output":true' in head
    assert body[length:] == x.tobytes()
    answer = b'{"outputs":[{"name":"logits","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
    arrays = conform(decode(answer, None), LOGITS, 1)
    np.testing.assert_array_equal(arrays["logits"], [[1, 2, 3, 4]])
    with pytest.raises(WireError, match="has no Open Inference Protocol datatype"):
        encode_request({"input": np.array(["a"])})


@pytest.mark.parametrize(
    ("outputs", "rows", "why"),
    [
        ({"logits": np.zeros((1, 5), np.float32)}, 1, r"shape \[1, 5\]"),  # wrong width
        ({"logits": np.zeros((2, 4), np.float32)}, 1, "with 1 rows"),  # rows of another batch
        ({"logits": np.zeros((1, 4), np.float64)}, 1, "float64, expected float32"),
        ({"logits": np.zeros((4,), np.float32)}, 1, r"shape \[4\]"),  # rank
        ({}, 1, "outputs none, expected logits"),
        ({"a": np.zeros((1, 4), np.float32), "b": np.zeros((1, 4), np.float32)}, 1, "outputs a"),
    ],
)
def test_a_wrong_answer_is_refused(outputs, rows, why) -> None:
    with pytest.raises(InferenceError, match=why):
        conform(outputs, LOGITS, rows)


def test_outputs_named_the_peers_way_are_taken_by_position() -> None:
    arrays = conform({"output_0": np.ones((2, 4), np.float32)}, LOGITS, 2)
    assert list(arrays) == ["logits"]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"outputs": 3}',
        b'{"outputs":[{"name":"y","datatype":"BYTES","shape":[1]}]}',
        b'{"outputs":[{"name":"y","datatype":"FP32","shape":[1,4],'
        b'"parameters":{"binary_data_size":16}}]}',  # 16 bytes promised, none sent
        b'{"outputs":[{"name":"y","datatype":"FP32","shape":[1],"data":{"a":1}}]}',
        b'{"outputs":["y"]}',
    ],
)
def test_a_malformed_answer_is_an_error(body) -> None:
    with pytest.raises(WireError):
        decode(body, str(len(body)))


def test_any_malformed_answer_takes_the_peer_out_as_an_inference_error() -> None:
    state = PeerState(PeerLink("b", "http://127.0.0.1:9"), "tiny")
    session = RemoteSession(state, [TensorInfo("input", "float32", (-1, 2))], LOGITS)
    session._exchange = lambda feeds: decode(b'{"outputs":[{"name":"y","datatype":"FP32",'
                                             b'"shape":[1],"data":{"a":1}}]}', None)  # fmt: skip
    with pytest.raises(InferenceError, match="peer b"):
        session.run({"input": np.zeros((1, 2), np.float32)})
    assert not state.up and state.failures == 1


def test_a_failed_peer_backs_off_doubling_and_resets_after_a_good_run() -> None:
    now = [100.0]
    link = PeerLink("b", "http://127.0.0.1:9")  # the discard port: nothing answers a probe
    state = PeerState(link, "tiny", backoff_s=1.0, backoff_max_s=3.0, clock=lambda: now[0])
    assert state.in_rotation()
    state.failed("refused")
    assert not state.in_rotation() and state.retry_at == 101.0
    now[0] = 101.0  # due: the probe runs in the background, the peer stays out meanwhile
    assert not state.in_rotation()
    assert state.wait_for(lambda s: s.probes == 1, 10)
    assert not state.up and state.retry_at == 103.0  # 2 s: doubled
    assert "readiness probe" in state.status()["last_error"]
    state.failed("again")
    assert state.retry_at == 104.0  # 3 s: capped at backoff_max_s
    state.up = True
    state.succeeded()
    state.failed("later")
    assert state.retry_at == 102.0  # a good run reset the back-off to 1 s


async def test_the_gate_leaves_a_peer_to_its_own_governor() -> None:
    gate = DeviceGate()
    await gate.acquire(lambda: HOT, "CPU")
    await gate.release("CPU", 0.5)
    assert gate.wait_s("CPU", HOT) > 5  # the hot board rests
    assert gate.wait_s("peer:b", HOT) == 0.0  # a peer does not
    await gate.acquire(lambda: HOT, "peer:b")
    await asyncio.wait_for(gate.acquire(lambda: HOT, "peer:b"), 10)  # not capped at 1 either
    assert gate.running_on("peer:b") == 2


def test_the_documented_peer_table_is_a_valid_config() -> None:
    page = REPO / "docs" / "operations" / "several-boards.md"
    blocks = re.findall(r"^```toml\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)
    (block,) = [b for b in blocks if "[[peer]]" in b]
    (peer,) = parse_config(block).peers
    assert (peer.label, peer.models, peer.latency_budget_ms) == (
        "board-b.local:8080",
        ["mobilenet_v2"],
        200,
    )
