"""Issue 27: agent releases through the hub server, with the stages and abort criteria of model
releases. The server verifies an upload under the trust file's *agent* role with the devices'
own code, keeps the agent's serial floor apart from the models', never signs code (a server
with a release key relays the agent envelope byte for byte), sends it only to the devices
whose platform and Python it has a wheelhouse for, and refuses to roll an agent deployment
back (devices roll a failed agent back by themselves)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from devtools.broker import Broker
from devtools.hub_fleet import Api, fleet, hub_server, make_release
from edgeagent.fleet.agent_manifest import AgentManifest, Wheelhouse, this_platform, this_python
from edgeagent.fleet.manifest import Artifact
from edgeagent.fleet.signing import decode_envelope, sign_envelope
from edgeagent.hub.keys import HubError, keygen, load_private_key
from edgeagent.hub.publish import read_release
from edgeagent.hub.server.client import HubApiClient, read_upload

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

NOW = datetime.now(timezone.utc).replace(microsecond=0)
OTHER_PLATFORM = "linux_riscv64"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _keys(tmp_path: Path) -> Path:
    """``hub keygen --agent-keys 1``: root, release (models) and agent keys, and trust.json."""
    keygen(tmp_path / "keys", agent_keys=1)
    return tmp_path / "keys"


def _agent_release(
    keys: Path,
    version: str,
    serial: int,
    *,
    key: str = "agent",
    platforms: tuple[str, ...] = (this_platform(),),
) -> bytes:
    """An agent release as ``hub sign --agent`` writes it, signed by ``keys/<key>.key``."""
    manifest = AgentManifest(
        version=version,
        serial=serial,
        python=this_python(),
        wheelhouses=tuple(
            Wheelhouse(
                tag,
                Artifact(
                    f"http://127.0.0.1:9/edgeagent-{version}-{tag}.wheelhouse.tar.gz",
                    1000,
                    _sha256(f"{version}-{tag}".encode()),
                ),
            )
            for tag in platforms
        ),
        issued_at=NOW,
        expires=NOW + timedelta(days=1),
        deployment_id=f"agent-{version}-{serial}",
    )
    return sign_envelope(manifest.to_payload(), [load_private_key(keys / f"{key}.key")])


def _model_release(keys: Path, version: str, *, key: str = "release", model: str = "") -> bytes:
    """``make_release``'s model release, signed by ``keys/<key>.key`` (``model``: renamed)."""
    envelope = make_release(version, **({"model": model} if model else {}))
    payload = decode_envelope(envelope, max_bytes=len(envelope)).payload
    return sign_envelope(payload, [load_private_key(keys / f"{key}.key")])


async def test_an_agent_release_goes_out_in_stages_exactly_as_uploaded(
    broker: Broker, tmp_path: Path
) -> None:
    keys = _keys(tmp_path)
    older, newer = _agent_release(keys, "0.2.0", 1), _agent_release(keys, "0.3.0", 2)
    settings = broker.settings()
    async with (
        fleet(settings, 4) as covered,
        fleet(settings, 1, name="quiet", lose_events=True) as quiet,  # answers by state only
        fleet(settings, 1, name="riscv", platform=OTHER_PLATFORM) as riscv,
        fleet(settings, 1, name="old", platform="", python="") as old,  # reports neither
        hub_server(  # a server that signs model releases: it must still relay the agent's
            f"sqlite:///{tmp_path / 'hub.db'}",
            settings,
            release_keys=(keys / "release.key",),
            trust_file=keys / "trust.json",
        ) as url,
    ):
        api = Api(url)
        await api.synced()
        device = await api.call("GET", "/api/v1/devices/dev-000")
        assert (device["platform"], device["python"]) == (this_platform(), this_python())
        assert (await api.call("GET", "/api/v1/devices/riscv-000"))["platform"] == OTHER_PLATFORM
        await api.call("POST", "/api/v1/releases", expect=201, data=older)
        stored = await api.call("POST", "/api/v1/releases", expect=201, data=newer)
        shown = {k: stored[k] for k in ("kind", "model", "version", "platforms", "python")}
        assert shown == {
            "kind": "agent",
            "model": "edgeagent",
            "version": "0.3.0",
            "platforms": [this_platform()],
            "python": this_python(),
        }
        listed = (await api.call("GET", "/api/v1/releases?model=edgeagent"))["releases"]
        assert [(r["kind"], r["version"]) for r in listed] == [
            ("agent", "0.3.0"),
            ("agent", "0.2.0"),
        ]

        created = await api.call(
            "POST",
            "/api/v1/deployments",
            expect=201,
            json={"release_id": stored["id"], "group": "lab", "stages_pct": [50, 100]},
        )
        assert created["device_count"] == 5
        assert created["left_out"] == {
            "devices": 2,
            "reasons": {
                f"platform {OTHER_PLATFORM}: no wheelhouse in this release": 1,
                "reports no platform or Python (an agent without self-updates)": 1,
            },
        }
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded", done
        assert [stage["succeeded"] for stage in done["stages"]] == [3, 2]
        for member in (*covered, *quiet):  # the uploaded bytes, once: not re-signed
            assert member.envelopes == [newer], member.topics.device_id
        assert riscv[0].envelopes == old[0].envelopes == []
        rows = {row["device_id"]: row for row in done["devices"]}
        assert {(r["envelope_sha256"], r["serial"], r["code"]) for r in rows.values()} == {
            (_sha256(newer), 2, "committed")
        }

        rollback = await api.call(
            "POST",
            f"/api/v1/deployments/{created['id']}/rollback",
            expect=422,
            json={"version": "0.2.0"},
        )
        assert "rolls back by itself" in rollback["error"], rollback
        assert "hub sign --agent" in rollback["error"], rollback
        after = await api.call("GET", f"/api/v1/deployments/{created['id']}")
        assert after["state"] == "succeeded"  # the refused rollback changed nothing
        replay = await api.call(  # stored before 0.3.0 went out: devices would refuse it now
            "POST",
            "/api/v1/deployments",
            expect=409,
            json={"model": "edgeagent", "version": "0.2.0", "group": "lab"},
        )
        assert "not above serial 2" in replay["error"], replay
        assert "hub sign --agent" in replay["error"], replay


async def test_failures_in_the_first_stage_abort_the_agent_deployment(
    broker: Broker, tmp_path: Path
) -> None:
    keys = _keys(tmp_path)
    path = tmp_path / "edgeagent-0.2.0.agent-release.json"
    path.write_bytes(_agent_release(keys, "0.2.0", 1))
    settings = broker.settings()
    async with (
        fleet(settings, 4, failing=2) as devices,  # dev-000, dev-001: stage 1, rolled back
        hub_server(
            f"sqlite:///{tmp_path / 'hub.db'}", settings, trust_file=keys / "trust.json"
        ) as url,
        HubApiClient(url) as client,  # what `hub rollout --server` does with it
    ):
        await Api(url).synced()
        plan = {"stages_pct": [50, 100], "abort_threshold_pct": 50, "min_executed": 2}
        deployment = await client.deploy(
            read_upload(path, keys / "trust.json"), group="lab", devices=[], plan=plan
        )
        done = await client.follow(deployment, lambda _: None, poll_s=30)
    assert done["state"] == "aborted", done
    assert [(s["failed"], s["not_sent"]) for s in done["stages"]] == [(2, 0), (0, 2)]
    codes = {row["device_id"]: row["code"] for row in done["devices"] if row["stage"] == 1}
    assert codes == {"dev-000": "health_check_failed", "dev-001": "health_check_failed"}
    assert [len(d.envelopes) for d in devices] == [1, 1, 0, 0]  # stage 2 never sent


async def test_agent_uploads_are_judged_under_the_agent_role_and_floor(
    broker: Broker, tmp_path: Path
) -> None:
    keys = _keys(tmp_path)
    settings = broker.settings()
    async with (
        fleet(settings, 2),
        hub_server(
            f"sqlite:///{tmp_path / 'hub.db'}", settings, trust_file=keys / "trust.json"
        ) as url,
    ):
        api = Api(url)
        await api.synced()
        first = _agent_release(keys, "0.3.0", 3)
        await api.call("POST", "/api/v1/releases", expect=201, data=first)
        refused = [
            # a model key cannot ship code, nor the agent key weights: the device's refusal
            ("unknown_key", _agent_release(keys, "0.4.0", 4, key="release")),
            ("unknown_key", _model_release(keys, "2.0.0", key="agent")),
            ("replay", _agent_release(keys, "0.4.0", 2)),  # a newer version, an older serial
            ("reserved for agent releases", _model_release(keys, "2.0.0", model="edgeagent")),
        ]
        for code, envelope in refused:
            answer = await api.call("POST", "/api/v1/releases", expect=422, data=envelope)
            assert code in answer["error"], (code, answer)
        # the agent's serial floor is its own: a model release of a low serial is taken
        await api.call("POST", "/api/v1/releases", expect=201, data=_model_release(keys, "0.0.1"))
        again = _agent_release(keys, "0.3.0", 3)  # the same bytes (Ed25519 is deterministic)
        assert again == first
        await api.call("POST", "/api/v1/releases", expect=200, data=again)  # the same row

        riscv_only = _agent_release(keys, "0.5.0", 5, platforms=(OTHER_PLATFORM,))
        await api.call("POST", "/api/v1/releases", expect=201, data=riscv_only)
        nobody = await api.call(
            "POST",
            "/api/v1/deployments",
            expect=422,
            json={"model": "edgeagent", "version": "0.5.0", "group": "lab"},
        )
        assert nobody["error"] == (
            "none of the 2 targeted device(s) can install it: "
            f"2 platform {this_platform()}: no wheelhouse in this release"
        )
        assert (await api.call("GET", "/api/v1/deployments"))["deployments"] == []


def test_the_cli_rollout_that_re_signs_each_stage_refuses_an_agent_release(tmp_path: Path) -> None:
    """``hub rollout`` without ``--server`` signs every stage with the release key: code is
    never re-signed, so it names the way that relays the agent release as it was signed."""
    keys = _keys(tmp_path)
    path = tmp_path / "edgeagent-0.3.0.agent-release.json"
    path.write_bytes(_agent_release(keys, "0.3.0", 3))
    assert read_upload(path, keys / "trust.json") == path.read_bytes()  # either kind uploads
    with pytest.raises(HubError, match="an agent release, not a model's: .*--server"):
        read_release(path, keys / "trust.json")
