"""A peer as one more device: another edgeagent and the naive v2 server (a server we did not
write) take a throttled board's overflow; hostile peers (slow, wrongly shaped, refusing) leave
the rotation within one request and the request is served locally, answered once; local_only
and sealed models never reach a peer. Loopback only; every wait is on a condition."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import pytest

from devtools.agent_process import TOKEN as DAEMON_TOKEN
from devtools.agent_process import running_daemon
from devtools.ports import free_port
from devtools.simulated_runtime import install_simulated
from devtools.waiting import until
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.errors import Throttled
from edgeagent.engine.limits import ServingLimits
from edgeagent.engine.settings import EngineSettings
from edgeagent.hardware.instances import InstanceGroup
from edgeagent.hardware.peers import PeerSettings, with_peers
from edgeagent.models.package import load_package
from edgeagent.runtimes import remote as remote_module
from tests.support.hardware import FIXTURES, write_profile
from tests.support.helpers import REPO, write_tiny_package
from tests.support.http_agent import TOKEN, direct_run, tiny_agent
from tests.support.peers import HostilePeer, board, frames, infer_frames, lanes, served, serving

LOCAL_S = 0.2  # the local device's service time: a peer on loopback is far faster
THROTTLED = ServingLimits(duty_cycle=0.1, reason="hot (simulated)")


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


async def test_a_throttled_board_moves_its_overflow_to_an_edgeagent_peer(
    tmp_path, executor, monkeypatch
):
    sim = install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    with tiny_agent(tmp_path / "peer") as peer, direct_run(root) as reference:
        peers = [PeerSettings(url=peer.url, token=TOKEN, name="b")]
        load = LoadCounter()  # what the governor reads: this board's own work
        async with served(tmp_path, executor, root, peers, THROTTLED, load) as model:
            before = sim.sim["SIM0"].batches  # the probe's runs
            xs = frames(24)
            answers = await asyncio.gather(*(model.infer({"input": x}) for x in xs))
            for x, answer in zip(xs, answers, strict=True):  # each its own, correct answer
                np.testing.assert_allclose(answer["logits"], reference(x), rtol=1e-5, atol=1e-6)
            _, remote = lanes(model)
            served_there = sum(i.batches for i in remote)
            served_here = sim.sim["SIM0"].batches - before
            assert served_there > served_here  # the hot board sent most away
            assert served_here + served_there == len(xs)  # each batch ran once
            assert load.totals()[1] == served_here  # what heats this board: not the peer's
            answered, _, faults = peer.registry.get("tiny").stats.health()
            assert (answered, faults) == (served_there + 1, 0)  # + the lane's warm-up


async def test_a_full_local_queue_overflows_to_a_peer_with_room(tmp_path, executor, monkeypatch):
    """A request that finds this board's queue full goes to an idle peer instance instead of
    being answered 429; the peer is another ``edgeagent run`` process on loopback."""
    sim = install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    with running_daemon(tmp_path / "peer") as peer, direct_run(root) as reference:
        peers = [PeerSettings(url=peer.url, token=DAEMON_TOKEN, name="b", concurrency=2)]
        one = EngineSettings(max_queue=1)  # the second request at once finds the queue full
        async with served(tmp_path, executor, root, peers, settings=one) as model:
            before = sim.sim["SIM0"].batches
            xs = frames(3, seed=18)
            answers = await asyncio.gather(*(model.infer({"input": x}) for x in xs))
            for x, answer in zip(xs, answers, strict=True):
                np.testing.assert_allclose(answer["logits"], reference(x), rtol=1e-5, atol=1e-6)
            _, remote = lanes(model)
            served_there = sum(i.batches for i in remote)
            assert served_there >= 2 and served_there + sim.sim["SIM0"].batches - before == 3
        async with (
            aiohttp.ClientSession(headers=peer.headers) as http,
            http.get(f"{peer.url}/v2/models/tiny/stats") as response,
        ):
            stats = (await response.json())["model_stats"][0]["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (served_there + 1, 0)


# ---------------------------------------------------------------------------------------------
# The naive v2 server from the serving benchmark: a server we did not write


@pytest.fixture
def naive_peer(tmp_path) -> Iterator[str]:
    """``scripts/bench_peers.py naive`` serving the tiny model's file, as a separate process."""
    model = write_tiny_package(tmp_path / "naive") / "tiny.fp32.onnx"
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "bench_peers.py"), "naive", "--model", str(model),
         "--name", "tiny", "--threads", "1", "--socket", str(tmp_path / "naive.sock"),
         "--port", str(port)],
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


async def test_the_naive_v2_server_takes_the_overflow(tmp_path, executor, monkeypatch, naive_peer):
    sim = install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    root = write_tiny_package(tmp_path / "models" / "tiny")

    async def ready() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", urlsplit(naive_peer).port)
        except OSError:
            return False
        writer.close()
        return True

    await until(ready, what="the naive server listening")
    peers = [PeerSettings(url=naive_peer, name="naive")]
    async with served(tmp_path, executor, root, peers, THROTTLED) as model:
        before = sim.sim["SIM0"].batches
        xs = frames(16, seed=9)
        with direct_run(root) as reference:
            answers = await asyncio.gather(*(model.infer({"input": x}) for x in xs))
            for x, answer in zip(xs, answers, strict=True):
                np.testing.assert_allclose(answer["logits"], reference(x), rtol=1e-5, atol=1e-6)
        _, remote = lanes(model)
        assert sum(i.batches for i in remote) > sim.sim["SIM0"].batches - before


# ---------------------------------------------------------------------------------------------
# Hostile peers


@pytest.mark.parametrize("mode", ["slow", "misshapen", "dribbling"])
async def test_a_hostile_peer_leaves_the_rotation_and_the_request_is_served_locally(
    tmp_path, executor, monkeypatch, mode
):
    sim = install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    with direct_run(root) as reference, HostilePeer(reference) as hostile:
        peers = [PeerSettings(url=hostile.url, name="hostile", latency_budget_ms=500)]
        async with served(tmp_path, executor, root, peers) as model:
            _, remote = lanes(model)
            before = sim.sim["SIM0"].batches
            assert hostile.requests["good"] == 1 and remote[0].session.state.up  # warm-up
            hostile.mode = mode
            x = frames(1, seed=11)[0]
            answer = await model.infer({"input": x})  # the peer is faster: it is tried first
            np.testing.assert_allclose(answer["logits"], reference(x), rtol=1e-5, atol=1e-6)
            assert answer["logits"].shape == (1, 4)  # the local answer, not the misshapen one
            assert hostile.requests[mode] == 1 and sim.sim["SIM0"].batches == before + 1
            state = remote[0].session.state
            assert not state.up and state.failures == 1  # out of the rotation after one request
            for x in frames(3, seed=12):
                await model.infer({"input": x})
            assert hostile.requests[mode] == 1 and sim.sim["SIM0"].batches == before + 4


async def test_a_refusing_peer_is_out_within_one_request_and_reprobed_back(
    tmp_path, executor, monkeypatch
):
    sim = install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    with direct_run(root) as reference, HostilePeer(reference) as hostile:
        peers = [PeerSettings(url=hostile.url, name="flaky", reprobe_backoff_s=0.05)]
        async with served(tmp_path, executor, root, peers) as model:
            _, remote = lanes(model)
            state = remote[0].session.state
            before = sim.sim["SIM0"].batches
            hostile.close_port()  # connection refused from now on
            x = frames(1, seed=13)[0]
            answer = await model.infer({"input": x})
            np.testing.assert_allclose(answer["logits"], reference(x), rtol=1e-5, atol=1e-6)
            assert not state.up and "refused" in state.last_error.lower()
            assert sim.sim["SIM0"].batches == before + 1
            # Re-probed after its back-off: the port is still closed, so it stays out …
            assert not remote[0].available
            await until(lambda: state.probes >= 1 and not remote[0].available, what="re-probe")
            assert state.failures == 1 and "readiness probe" in state.last_error
            hostile.open_port()  # … until it answers again: back in the rotation
            await until(lambda: remote[0].available, what="peer back after a re-probe")
            good = hostile.requests["good"]
            await asyncio.gather(*(model.infer({"input": x}) for x in frames(8, seed=14)))
            assert hostile.requests["good"] > good


async def test_a_connection_the_peer_closed_while_idle_is_not_a_failure(
    tmp_path, executor, monkeypatch
):
    install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    with direct_run(root) as reference, HostilePeer(reference) as peer:
        peers = [PeerSettings(url=peer.url, name="b", concurrency=1)]
        async with served(tmp_path, executor, root, peers) as model:
            _, remote = lanes(model)
            peer.close_port()  # its keep-alive connection is closed (a restart, an idle time-out)
            peer.open_port()
            good = peer.requests["good"]
            await model.infer({"input": frames(1, seed=15)[0]})
            state = remote[0].session.state
            assert peer.requests["good"] == good + 1  # served there, on a new connection
            assert state.up and state.failures == 0


# ---------------------------------------------------------------------------------------------
# Models that never leave the device


@pytest.mark.parametrize("why", ["local_only", "sealed"])
async def test_a_local_only_or_sealed_model_never_reaches_a_peer(
    tmp_path, executor, monkeypatch, why
):
    install_simulated(monkeypatch, {"SIM0": 0.0})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    if why == "local_only":
        serving(root, local_only=True)
    with direct_run(root) as reference, HostilePeer(reference) as peer:
        peers = [PeerSettings(url=peer.url, name="b")]
        plain = load_package(root)
        session = board(tmp_path, [] if why == "sealed" else peers).open(plain)
        try:
            if why == "sealed":  # its variant's files exist only encrypted on this device
                variant = dataclasses.replace(
                    plain.variants[0], sealed_files=plain.variants[0].files
                )
                sealed = dataclasses.replace(plain, variants=(variant,))
                assert with_peers(sealed, session, peers) is session
                assert sum(peer.requests.values()) == 0
                assert with_peers(plain, session, peers) is not session  # the plain one would go
            else:
                assert not isinstance(session, InstanceGroup)  # no peer lane at all
            for x in frames(4):
                np.testing.assert_allclose(
                    session.run({"input": x})["logits"], reference(x), rtol=1e-5, atol=1e-6
                )
            assert sum(peer.requests.values()) == (1 if why == "sealed" else 0)
        finally:
            session.close()


async def test_the_daemon_takes_its_peers_from_config_and_shows_them(tmp_path, monkeypatch):
    install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    write_profile(tmp_path / "profiles", "test", ["onnxruntime:SIM0:fp32"])
    serving(write_tiny_package(tmp_path / "models" / "tiny"), plan="fixed", instances=1)
    with tiny_agent(tmp_path / "peer") as peer:
        daemon = Daemon(
            parse_config(
                f"[agent]\nstate_dir = '{tmp_path / 'state'}'\n"
                f"models_dir = '{tmp_path / 'models'}'\n"
                f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
                f"[hardware]\nroot = '{FIXTURES / 'generic-x86_64'}'\n"
                f"profiles_dir = '{tmp_path / 'profiles'}'\nprofile = 'test'\n"
                f"[[peer]]\nurl = '{peer.url}'\nname = 'b'\ntoken = '{TOKEN}'\nconcurrency = 1\n"
            )
        )
        await daemon.start()
        connector = aiohttp.UnixConnector(path=str(tmp_path / "agent.sock"))
        try:
            async with aiohttp.ClientSession(connector=connector, base_url="http://agent") as http:
                await infer_frames(http, 4)
                async with http.get("/v1/status") as response:
                    status = await response.json()
                shown = status["models"]["tiny"]["versions"]["1"]["session"]["instances"]
                assert [s["device"] for s in shown] == ["SIM0", "peer:b"]
                assert shown[1]["batches"] >= 1 and shown[1]["active"]["device"] == "peer:b"
                async with http.get("/metrics") as response:
                    text = await response.text()
                assert 'edgeagent_execution_instance{device="peer:b",field="share"' in text
        finally:
            await daemon.stop()


async def test_what_the_governor_would_shed_goes_to_a_peer_instead(tmp_path, executor, monkeypatch):
    """In the critical state the governor sheds every request (503); a board with a peer in
    the rotation sends them there, and sheds again once the peer is gone."""
    install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    critical = ServingLimits(
        shed_priority_from=0, max_concurrency=1, duty_cycle=0.05, reason="critical (simulated)"
    )
    with direct_run(root) as reference, HostilePeer(reference) as peer:
        peers = [PeerSettings(url=peer.url, name="b")]
        async with served(tmp_path, executor, root, peers, critical) as model:
            good = peer.requests["good"]
            xs = frames(4, seed=16)
            answers = await asyncio.gather(*(model.infer({"input": x}) for x in xs))
            for x, answer in zip(xs, answers, strict=True):
                np.testing.assert_allclose(answer["logits"], reference(x), rtol=1e-5, atol=1e-6)
            assert peer.requests["good"] > good  # the peer answered what would have been shed
            peer.close_port()
            answer = await model.infer({"input": xs[0]})  # tried there, served here, once
            np.testing.assert_allclose(answer["logits"], reference(xs[0]), rtol=1e-5, atol=1e-6)
            with pytest.raises(Throttled):  # the peer is out: the board sheds again
                await model.infer({"input": xs[0]})


async def test_an_oversized_answer_is_refused_unread(tmp_path, executor, monkeypatch):
    install_simulated(monkeypatch, {"SIM0": LOCAL_S})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    with direct_run(root) as reference, HostilePeer(reference) as peer:
        peers = [PeerSettings(url=peer.url, name="b")]
        async with served(tmp_path, executor, root, peers) as model:
            _, remote = lanes(model)
            monkeypatch.setattr(remote_module, "MAX_ANSWER_BYTES", 64)  # smaller than one answer
            x = frames(1, seed=17)[0]
            answer = await model.infer({"input": x})
            np.testing.assert_allclose(answer["logits"], reference(x), rtol=1e-5, atol=1e-6)
            state = remote[0].session.state
            assert not state.up and "over 64" in state.last_error
