"""The on-device canary of a release (issue 11 item 4) over a real Mosquitto, signed with the
``hub sign --canary`` CLI: promoted under good traffic; rolled back when the new version errors
or is slower than ``max_p99_ratio`` (real ONNX graphs made bad on purpose, devtools/tiny.py);
with no traffic by ``max_seconds`` the golden check decides (or the config says roll back); a
device that cannot hold both versions refuses before downloading; a crash mid-canary is
never committed. A canary waits outside the update worker: another model's release installs
meanwhile, a newer release of the same model supersedes it, and a table out of bounds (10**400)
is refused and reported (issue 23 §6, §12)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.engine.errors import ServingError
from edgeagent.fleet.manifest import parse_manifest
from edgeagent.fleet.signing import decode_envelope, sign_envelope
from edgeagent.fleet.topics import GroupTopics
from edgeagent.fsutil import write_json_atomic
from edgeagent.hub.keys import load_private_key
from edgeagent.hub.publish import hub_client
from edgeagent.hub.sign import release_path
from edgeagent.updates.canary_step import PARKED, recover_parked
from edgeagent.updates.store import ModelStore, PendingInstall
from tests.integration.test_hub import hub as hub_cli
from tests.integration.test_release_v2 import _publish
from tests.integration.test_updates_helpers import (
    Device,
    Hub,
    Online,
    add_golden,
    hub_fixture,  # noqa: F401 - fixture
    make_device,
    stacks_fixture,  # noqa: F401 - fixture
)
from tests.support.helpers import write_tiny_package

pytestmark = pytest.mark.broker


def _sign(hub: Hub, version: str, canary: str | None, name: str = "tiny", **bad: Any) -> Path:
    """``hub sign`` (the CLI) of a tiny package, ``--canary CANARY`` when given; ``bad`` makes
    the model slow or failing (devtools.tiny.write_tiny_onnx)."""
    package = write_tiny_package(
        hub.root / "packages" / f"{name}-{version}", name, version, seed=int(version), **bad
    )
    signed = _hub_sign(hub, add_golden(package), *([] if canary is None else ["--canary", canary]))
    assert signed.returncode == 0, signed.stderr
    return release_path(hub.artifacts, name, version)


def _hub_sign(hub: Hub, package: Path, *extra: str):
    """``edgeagent hub sign PACKAGE --json EXTRA…`` with the hub's key, URL and artifacts."""
    args = ["sign", str(package), "--key", str(hub.keys / "release.key"), "--json"]
    return hub_cli(*args, "--base-url", hub.url, "--out", str(hub.artifacts), *extra)


class Traffic:
    """Clients sending unversioned requests through the device's registry until stopped;
    answers and failures counted per version that took them."""

    def __init__(self, online: Online, value: float | None = None, clients: int = 2) -> None:
        self.registry = online.device.registry
        rng = np.random.default_rng(3)
        feeds = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
        self.feeds = {"input": feeds if value is None else np.full_like(feeds, value)}
        self.answered: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._client()) for _ in range(clients)]

    async def _client(self) -> None:
        while not self._stop.is_set():
            model = self.registry.get("tiny")
            try:
                await model.infer(self.feeds)
                self.answered[model.version] += 1
            except ServingError:
                self.failed[model.version] += 1

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def _serving_v1(stacks, hub: Hub, broker: Broker) -> Online:
    online = await (await stacks("dev-1")).start()
    assert (await _publish(hub, broker, _sign(hub, "1", None))).returncode == 0
    await until(lambda: (online.outcome() or {}).get("code") == "committed")
    assert online.device.serving() == "1"
    return online


def _deployment(release: Path) -> str:
    """The deployment id ``hub sign`` put into the envelope it wrote."""
    envelope = decode_envelope(release.read_bytes(), max_bytes=1 << 20)
    return parse_manifest(envelope.payload).deployment_id


async def _canary_outcome(online: Online, release: Path, hub: Hub, broker: Broker) -> dict:
    deployment = _deployment(release)
    assert (await _publish(hub, broker, release)).returncode == 0
    await until(lambda: (online.outcome() or {}).get("deployment_id") == deployment, timeout=120)
    outcome = online.outcome()
    assert outcome is not None
    steps = [e["step"] for e in online.device.events if e.get("deployment_id") == deployment]
    assert "canary" in steps and "activated" not in steps  # no hot swap: a canary beside v1
    return outcome


async def test_a_canary_is_promoted_under_good_traffic(stacks, hub: Hub, broker: Broker) -> None:
    online = await _serving_v1(stacks, hub, broker)
    traffic = Traffic(online)
    # ratio 100: two equal models on a loaded machine must not read as a latency regression
    release = _sign(hub, "2", "share=0.5,min_requests=40,max_p99_ratio=100,max_seconds=300")
    outcome = await _canary_outcome(online, release, hub, broker)
    await traffic.stop()
    assert (outcome["result"], outcome["code"]) == ("succeeded", "committed"), outcome
    figures = outcome["canary"]
    assert (figures["outcome"], figures["decided_by"]) == ("promoted", "traffic")
    assert figures["canary_requests"] >= 40 and figures["canary_faults"] == 0
    assert figures["stable_requests"] > 0 and figures["p99_ratio"] > 0
    assert "canary promoted" in outcome["message"] and "p99" in outcome["message"]
    assert online.device.serving() == "2" and online.device.store.current("tiny") == "2"
    assert sum(traffic.failed.values()) == 0 and traffic.answered["2"] >= 40


async def test_a_canary_that_errors_is_rolled_back_and_marked_bad(
    stacks, hub: Hub, broker: Broker
) -> None:
    online = await _serving_v1(stacks, hub, broker)
    traffic = Traffic(online, value=50.0)  # version 2 fails on inputs above 10
    release = _sign(hub, "2", "share=0.2,min_requests=50,max_error_rate=0.01", fail_above=10.0)
    outcome = await _canary_outcome(online, release, hub, broker)
    await traffic.stop()
    assert (outcome["result"], outcome["code"]) == ("failed", "canary_failed"), outcome
    figures = outcome["canary"]
    assert figures["outcome"] == "rolled_back" and figures["canary_faults"] >= 1
    assert figures["error_rate"] > 0.01 and "requests failed" in outcome["message"]
    # one fault of 50 at most 1% decides at once: only those few requests ever failed
    assert traffic.failed["1"] == 0 and 1 <= traffic.failed["2"] <= 4
    store = online.device.store
    assert online.device.serving() == "1" and store.current("tiny") == "1"
    assert store.versions("tiny") == ["1"] and store.bad_versions("tiny") == {"2"}


async def test_a_canary_slower_than_max_p99_ratio_is_rolled_back(
    stacks, hub: Hub, broker: Broker
) -> None:
    online = await _serving_v1(stacks, hub, broker)
    traffic = Traffic(online)
    # ~30 ms a run alone against ~0.01 ms: the stable version's p99 is all noise from sharing
    # two cores with the canary (4.8 ms was seen in CI against a 150-MatMul canary's 13.6), so
    # the canary is made slow enough to clear any such noise by far, and the ratio is 2
    release = _sign(hub, "2", "share=0.5,min_requests=30,max_p99_ratio=2", slow_matmuls=600)
    outcome = await _canary_outcome(online, release, hub, broker)
    await traffic.stop()
    assert (outcome["result"], outcome["code"]) == ("failed", "canary_failed"), str(
        outcome["canary"]
    )
    figures = outcome["canary"]
    assert figures["outcome"] == "rolled_back" and figures["p99_ratio"] > 2
    assert figures["canary_requests"] >= 30 and figures["canary_faults"] == 0
    assert "max_p99_ratio 2" in outcome["message"]
    assert sum(traffic.failed.values()) == 0  # slow, not failing: every request answered
    assert online.device.serving() == "1" and online.device.store.bad_versions("tiny") == {"2"}


async def _serving_v1_offline(hub: Hub, tmp_path: Path, executor, **settings: Any) -> Device:
    """A device stack (no MQTT) with ``[updates]`` ``settings`` that committed version 1."""
    device = make_device(tmp_path / "device", hub.keys / "trust.json", executor, **settings)
    assert (await device.apply(_sign(hub, "1", None).read_bytes()))["code"] == "committed"
    return device


@pytest.mark.parametrize(
    ("without_traffic", "result", "serving"),
    [("golden", "succeeded", "2"), ("rollback", "failed", "1")],
)
async def test_with_no_traffic_by_max_seconds_the_config_decides(
    hub: Hub, tmp_path: Path, without_traffic: str, result: str, serving: str
) -> None:
    with ThreadPoolExecutor(2) as executor:
        device = await _serving_v1_offline(
            hub, tmp_path, executor, canary_without_traffic=without_traffic
        )
        try:
            outcome = await device.apply(_sign(hub, "2", "max_seconds=1").read_bytes())
            assert outcome["result"] == result, outcome
            figures = outcome["canary"]
            assert (figures["decided_by"], figures["canary_requests"]) == ("max_seconds", 0)
            assert (
                f"without_traffic = {'promote' if serving == '2' else 'rollback'}"
                in (outcome["message"])
            )
            assert device.serving() == serving and device.store.current("tiny") == serving
        finally:
            await device.registry.close()


async def test_a_device_that_cannot_hold_both_versions_refuses_before_downloading(
    hub: Hub, tmp_path: Path
) -> None:
    with ThreadPoolExecutor(2) as executor:
        # more memory to keep free than any machine has
        device = await _serving_v1_offline(hub, tmp_path, executor, canary_min_free_bytes=2**60)
        try:
            before = device.store.snapshot()
            events = len(device.events)
            outcome = await device.apply(_sign(hub, "2", "").read_bytes())
            assert (outcome["result"], outcome["code"]) == ("refused", "insufficient_memory")
            assert "canary_min_free_bytes" in outcome["message"]
            assert "MiB is available" in outcome["message"]
            assert not any(e.get("step") == "downloading" for e in device.events[events:])
            assert device.store.snapshot() == before and device.serving() == "1"
        finally:
            await device.registry.close()


def test_a_restart_mid_canary_leaves_the_old_release_current(tmp_path: Path) -> None:
    """What recover() finds after a crash while the canary ran: never committed, not bad."""
    store = ModelStore(tmp_path)
    store.install("tiny", "1", write_tiny_package(tmp_path / "p1"))
    store.set_current("tiny", "1")
    store.raise_floor("tiny", "1", 1)
    pending = PendingInstall("tiny", "2", "1", "d-canary", serial=2)
    store.begin(pending)
    store.install("tiny", "2", write_tiny_package(tmp_path / "p2", version="2"))
    store.advance(pending, "installed")
    store.advance(pending, "canary")
    recovery = ModelStore(tmp_path).recover()
    assert recovery is not None and recovery.outcome == "rolled_back"
    assert "its canary had no verdict" in recovery.reason
    assert store.current("tiny") == "1" and store.versions("tiny") == ["1"]
    assert store.pending() is None and store.bad_versions("tiny") == set()
    assert store.serial_floor("tiny") == 1


def test_hub_sign_refuses_a_canary_out_of_bounds(hub: Hub) -> None:
    package = add_golden(write_tiny_package(hub.root / "packages" / "bad", version="5"))
    for canary, why in (("share=0.9", "0.001..0.5"), ("min_requests=x", "not a number")):
        signed = _hub_sign(hub, package, "--canary", canary)
        assert signed.returncode == 2 and why in signed.stderr, signed.stderr
    assert not release_path(hub.artifacts, "tiny", "5").exists()
    good = json.loads(_hub_sign(hub, package, "--canary", "share=0.25,max_seconds=60").stdout)
    assert Path(good["release"]).exists()
    assert _canary_of(Path(good["release"])) == {"share": 0.25, "max_seconds": 60.0}


def _canary_of(release: Path) -> dict | None:
    payload = json.loads(decode_envelope(release.read_bytes(), max_bytes=1 << 20).payload)
    return payload.get("canary")


# In bounds, yet it could only conclude at its time-out, a week from now: no traffic reaches a
# share of one in a thousand of nothing, and a million requests would not come anyway.
WEEK_LONG = "share=0.001,min_requests=1000000,max_seconds=604800"


async def _outcome_of(online: Online, release: Path, hub: Hub, broker: Broker) -> dict:
    """Publish ``release`` (``hub publish``) and wait for its deployment's outcome."""
    deployment = _deployment(release)
    assert (await _publish(hub, broker, release)).returncode == 0
    await until(lambda: _last_outcome(online, deployment) is not None, timeout=120)
    outcome = _last_outcome(online, deployment)
    assert outcome is not None
    return outcome


def _stepped(online: Online, deployment: str, step: str) -> bool:
    """Whether the device sent the progress event ``step`` for ``deployment``."""
    return any(
        e.get("deployment_id") == deployment and e.get("step") == step for e in online.device.events
    )


def _last_outcome(online: Online, deployment: str) -> dict | None:
    """The outcome event the device sent for ``deployment`` (None before it has)."""
    outcomes = [
        e
        for e in online.device.events
        if e.get("deployment_id") == deployment and e.get("result") is not None
    ]
    return outcomes[-1] if outcomes else None


async def test_a_waiting_canary_holds_no_other_release_and_a_newer_one_supersedes_it(
    stacks, hub: Hub, broker: Broker
) -> None:
    online = await _serving_v1(stacks, hub, broker)
    assert (await _outcome_of(online, _sign(hub, "1", None, "other"), hub, broker))[
        "code"
    ] == "committed"
    waiting = _sign(hub, "2", WEEK_LONG)
    assert (await _publish(hub, broker, waiting)).returncode == 0
    await until(lambda: _stepped(online, _deployment(waiting), "canary"), timeout=60)
    # another model's release gets its outcome while the week-long canary waits
    other = await _outcome_of(online, _sign(hub, "2", None, "other"), hub, broker)
    assert (other["result"], other["code"]) == ("succeeded", "committed"), other
    assert online.device.serving("other") == "2" and online.device.serving() == "1"
    assert _last_outcome(online, _deployment(waiting)) is None  # still waiting
    assert online.device.updater.status()["canaries"] == {"tiny": "2"}
    # a newer release of the same model concludes it as superseded, then installs
    newer = await _outcome_of(online, _sign(hub, "3", None), hub, broker)
    assert (newer["result"], newer["code"]) == ("succeeded", "committed"), newer
    superseded = _last_outcome(online, _deployment(waiting))
    assert superseded is not None
    assert (superseded["result"], superseded["code"]) == ("failed", "canary_superseded")
    assert "superseded by tiny 3" in superseded["message"]
    assert superseded["canary"]["decided_by"] == "interrupted"
    store = online.device.store
    assert online.device.serving() == "3" and store.current("tiny") == "3"
    assert "2" not in store.versions("tiny") and store.bad_versions("tiny") == set()
    assert online.device.registry.versions("tiny") == ["3"]  # the canary's version retired
    assert online.device.updater.status()["canaries"] == {} and store.pending() is None


async def test_a_canary_table_out_of_bounds_is_refused_and_reported(
    stacks, hub: Hub, broker: Broker
) -> None:
    """A signed table of 10**400 used to crash the manifest parser: the update worker logged
    an exception and sent no report. It is refused naming the field, and the worker goes on."""
    online = await _serving_v1(stacks, hub, broker)
    release = _sign(hub, "2", "max_seconds=60")
    payload = json.loads(decode_envelope(release.read_bytes(), max_bytes=1 << 20).payload)
    payload["canary"]["max_seconds"] = 10**400  # json writes the exact integer
    forged = sign_envelope(
        json.dumps(payload).encode(), [load_private_key(hub.keys / "release.key")]
    )
    async with hub_client(broker.settings(), "raw") as client:  # hub publish would refuse it
        await client.publish(str(GroupTopics("edgeagent", "lab").release("tiny")), forged, qos=1)
    await until(lambda: (online.outcome() or {}).get("result") == "refused", timeout=60)
    outcome = online.outcome()
    assert outcome is not None and outcome["code"] == "malformed", outcome
    assert "manifest canary: canary max_seconds" in outcome["message"]
    assert "is not within 1..604800" in outcome["message"]
    assert online.device.serving() == "1" and online.device.store.versions("tiny") == ["1"]
    after = await _outcome_of(online, _sign(hub, "3", None), hub, broker)
    assert after["code"] == "committed" and online.device.serving() == "3"


def test_a_restart_with_a_parked_canary_rolls_it_back(tmp_path: Path) -> None:
    """A canary waiting outside the worker is recorded in canaries.json; after a crash it is
    rolled back like an unfinished canary in pending.json, and reported as recovered."""
    store = ModelStore(tmp_path)
    store.install("tiny", "1", write_tiny_package(tmp_path / "p1"))
    store.set_current("tiny", "1")
    store.raise_floor("tiny", "1", 1)
    store.install("tiny", "2", write_tiny_package(tmp_path / "p2", version="2"))
    parked = PendingInstall("tiny", "2", "1", "d-canary", serial=2, step="canary")
    write_json_atomic(store.root / PARKED, {"tiny": dataclasses.asdict(parked)})
    assert store.recover() is None  # pending.json is free: the canary was parked
    [recovery] = recover_parked(store, None)
    assert (recovery.outcome, recovery.pending.version) == ("rolled_back", "2")
    assert "its canary had no verdict" in recovery.reason
    assert store.current("tiny") == "1" and store.versions("tiny") == ["1"]
    assert store.pending() is None and store.bad_versions("tiny") == set()
    assert not (store.root / PARKED).exists() and recover_parked(store, None) == []
