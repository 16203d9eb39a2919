"""Hub replicas on one PostgreSQL: one rollout controller at a time, fenced by the database.

Three real ``hub server`` processes, a real PostgreSQL and a real Mosquitto; the devices speak
the real wire protocol (``FakeDevice``) and count every envelope the broker delivers to them.
The leader is SIGKILLed mid-rollout (another replica resumes it; nobody gets an envelope
twice) or SIGSTOPped until another one took over (woken, it sends nothing). The fence itself
is checked without processes too: a controller whose token is stale moves and sends nothing
even while its own clock still believes in its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.broker import Broker
from devtools.hub_fleet import Api, FakeDevice, fleet, make_release
from devtools.hub_replicas import Replica, leader, new_leader, replicas
from devtools.waiting import until
from edgeagent.fleet.manifest import parse_manifest
from edgeagent.fleet.signing import decode_envelope
from edgeagent.hub.policy import StagedPolicy
from edgeagent.hub.server import deploydb, deployreads, releasedb, targets
from edgeagent.hub.server.changes import Changes
from edgeagent.hub.server.controller import RolloutController
from edgeagent.hub.server.database import open_engine, upgrade
from edgeagent.hub.server.leadership import Leadership, NotLeader, claim
from edgeagent.hub.server.schema import devices
from tests.support.postgres import Postgres, postgres_fixture  # noqa: F401

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(120)]

LEASE = ("--lease", "2", "--lease-renew", "0.5", "--log-level", "INFO")


@pytest.fixture(name="pg_url")
def pg_url_fixture(postgres: Postgres) -> str:
    """A fresh database in the session's PostgreSQL (made outside the test's event loop)."""
    return postgres.create_database()


@dataclasses.dataclass
class Rollout:
    """Three replicas, six held devices, a deployment whose stage 1 the leader has sent."""

    devices: list[FakeDevice]
    group: dict[str, Replica]
    deployment_id: str
    leader: Replica
    token: int
    hold: asyncio.Event


@contextlib.asynccontextmanager
async def _stage_one_sent(broker: Broker, url: str) -> AsyncIterator[Rollout]:
    settings = broker.settings()
    hold = asyncio.Event()
    async with (
        fleet(settings, 6, hold=hold) as devices,
        replicas(url, settings, 3, *LEASE) as group,
    ):
        apis = [Api(r.url) for r in group.values()]
        await asyncio.gather(*(api.synced() for api in apis))
        created = await apis[0].deploy("2.0.0", stages_pct=[50, 100])
        await asyncio.gather(*(d.got_release.wait() for d in devices[:3]))
        path = f"/api/v1/deployments/{created['id']}"  # any replica reads what the leader did
        await apis[1].long_poll(path, lambda found: found["totals"]["sent"] >= 3)
        name, token = await leader(url)
        yield Rollout(devices, group, created["id"], group[name], token, hold)


async def test_sigkill_the_leader_another_replica_resumes_exactly_once(
    broker: Broker, pg_url: str
) -> None:
    async with _stage_one_sent(broker, pg_url) as rollout:
        old = rollout.leader
        assert old.stop(signal.SIGKILL) == -signal.SIGKILL
        rollout.hold.set()  # stage 1 answers; the survivors store them
        name, token = await new_leader(pg_url, rollout.token)
        assert name != old.name and token > rollout.token
        survivor = Api(rollout.group[name].url)
        done = await survivor.until(rollout.deployment_id, "succeeded", "aborted")
        assert done["state"] == "succeeded", done
        assert done["totals"]["succeeded"] == 6
        await asyncio.gather(*(d.answered.wait() for d in rollout.devices))
        assert [len(d.envelopes) for d in rollout.devices] == [1] * 6  # nobody got it twice
        # every replica ingested each answer; the history holds each once
        for device in rollout.devices:
            path = f"/api/v1/devices/{device.topics.device_id}/history?kind=event"
            history = (await survivor.call("GET", path))["events"]
            assert [e["result"] for e in history].count("succeeded") == 1, history
        # the dashboard's long poll on a replica that is not the leader sees the change
        other = next(r for r in rollout.group.values() if r.name not in (name, old.name))
        seen = await Api(other.url).until(rollout.deployment_id, "succeeded")
        assert seen["totals"]["succeeded"] == 6
        # and each replica says whether it leads (what an operator asks of a load balancer)
        leading = (await survivor.call("GET", "/api/v1/health"))["controller"]
        assert (leading["leading"], leading["token"]) == (True, token)
        assert leading["replica"].startswith(f"{name}/")
        follower = (await Api(other.url).call("GET", "/api/v1/health"))["controller"]
        assert follower["leading"] is False


async def test_a_paused_leader_that_wakes_sends_nothing(broker: Broker, pg_url: str) -> None:
    async with _stage_one_sent(broker, pg_url) as rollout:
        old = rollout.leader
        old.send(signal.SIGSTOP)
        name, token = await new_leader(pg_url, rollout.token)
        assert name != old.name and token > rollout.token
        old.send(signal.SIGCONT)  # stage 1 still waits for its answers: there is work
        lost = old.lines.index(await old.wait_line("lost the controller's lease"))
        rollout.hold.set()
        survivor = Api(rollout.group[name].url)
        done = await survivor.until(rollout.deployment_id, "succeeded", "aborted")
        assert done["state"] == "succeeded", done
        await asyncio.gather(*(d.answered.wait() for d in rollout.devices))
        assert [len(d.envelopes) for d in rollout.devices] == [1] * 6
        assert (await leader(pg_url))[0] == name  # the woken one did not take the lease back
        after = old.lines[lost:]
        assert not any("leads the rollout controller" in line for line in after), after
        # a graceful stop hands the lease over at once instead of letting it expire
        assert rollout.group[name].stop(signal.SIGTERM) == 0
        assert any("let the controller's lease go" in x for x in rollout.group[name].lines)


@pytest.fixture(name="scheduled")
async def scheduled_fixture(pg_url: str) -> AsyncIterator[tuple[AsyncEngine, str]]:
    """A migrated database with three devices and a deployment of 2.0.0 to them, scheduled."""
    engine = open_engine(pg_url)
    await upgrade(engine)
    envelope = make_release("2.0.0")
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=65536).payload)
    async with engine.begin() as connection:
        await connection.execute(
            devices.insert(),
            [
                {"device_id": f"dev-{i}", "models": {}, "backends": {}}
                | {"temperatures": {}, "last_seen": time.time()}
                for i in range(3)
            ],
        )
        release, _ = await releasedb.add_release(connection, envelope, manifest)
        deployment_id = await deploydb.create_deployment(
            connection,
            release,
            targets.TargetSpec(device_ids=("dev-0", "dev-1", "dev-2")),
            StagedPolicy(stages_pct=(100.0,)),
        )
    try:
        yield engine, deployment_id
    finally:
        await engine.dispose()


async def _untouched(engine: AsyncEngine, deployment_id: str, leadership: Leadership) -> list[str]:
    """Run one controller pass with ``leadership`` (it must refuse: ``NotLeader``); check the
    deployment did not move; returns the topics it published to."""
    published: list[str] = []

    async def publish(topic: str, payload: bytes) -> None:
        published.append(topic)

    controller = RolloutController(engine, publish, "edgeagent", Changes(), leadership=leadership)
    with pytest.raises(NotLeader):
        await controller.run_once()
    async with engine.connect() as connection:
        found = await deployreads.get_deployment(connection, deployment_id)
    assert found is not None and (found["state"], found["stage"]) == ("scheduled", 0)
    return published


async def test_a_stale_token_is_refused_by_the_database(
    scheduled: tuple[AsyncEngine, str],
) -> None:
    """The database decides: a controller whose lease was taken over moves and sends nothing,
    even while its own clock says its lease still holds (a clock that did not notice)."""
    engine, deployment_id = scheduled
    old = Leadership(engine, "old", lease_s=60, renew_s=5)
    assert await old.claim_once() and old.token is not None
    assert not await Leadership(engine, "other", lease_s=60, renew_s=5).claim_once()
    async with engine.begin() as connection:  # taken by force (a clock far ahead)
        newer = await claim(connection, "newer", None, 60, force=True)
    assert newer == old.token + 1
    assert old.check() == old.token  # its own clock still trusts the lease
    assert await _untouched(engine, deployment_id, old) == []


async def test_a_leader_whose_lease_lapsed_acts_no_more(
    scheduled: tuple[AsyncEngine, str],
) -> None:
    """A leader paused past its lease (its renewals stopped) stops by its own clock, before
    any other replica took the lease and bumped the token the database checks."""
    engine, deployment_id = scheduled
    paused = Leadership(engine, "paused", lease_s=0.6, renew_s=0.2)
    assert await paused.claim_once()
    await until(lambda: not paused.leading(), 10, what="the lease lapsing")
    assert await _untouched(engine, deployment_id, paused) == []
    assert await paused.claim_once()  # nobody took it meanwhile: it renews and leads again
