"""The hub CLI as an operator uses it: keygen → sign → serve → publish → status, plus the
rollout stage arithmetic and the usage errors."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from devtools.broker import Broker
from devtools.ports import free_port
from edgeagent.cli import main
from edgeagent.fleet.signing import decode_envelope
from edgeagent.hub.keys import HubError
from edgeagent.hub.policy import StagedPolicy
from edgeagent.hub.status import fleet_row, format_table
from tests.support.helpers import write_tiny_package

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def hub(*args: str) -> Result:
    """``edgeagent hub ARGS`` through the real entry point, in this process (fast)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["hub", *args])
    return Result(code, out.getvalue(), err.getvalue())


@pytest.mark.broker
async def test_keygen_sign_serve_publish_status(tmp_path: Path, broker: Broker) -> None:
    keys, out = tmp_path / "keys", tmp_path / "out"
    made = await asyncio.to_thread(hub, "keygen", str(keys), "--json")
    assert made.returncode == 0, made.stderr
    assert {k["name"] for k in json.loads(made.stdout)["keys"]} == {"root", "release"}
    assert (keys / "release.key").stat().st_mode & 0o777 == 0o600

    port = free_port()
    package = write_tiny_package(tmp_path / "tiny", version="3")
    signed = await asyncio.to_thread(
        hub,
        "sign",
        str(package),
        "--key",
        str(keys / "release.key"),
        "--out",
        str(out),
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--trust",
        str(keys / "trust.json"),
        "--json",
    )
    assert signed.returncode == 0, signed.stderr
    artifact = Path(json.loads(signed.stdout)["artifact"])

    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgeagent.cli",
            "hub",
            "serve",
            str(out),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        assert b"serving" in server.stdout.readline()
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/{artifact.name}"
            async with http.get(url, headers={"Range": "bytes=10-"}) as response:
                assert response.status == 206
                assert await response.read() == artifact.read_bytes()[10:]
            async with http.get(f"http://127.0.0.1:{port}/..%2Fkeys%2Frelease.key") as response:
                assert response.status == 404
    finally:
        server.terminate()
        server.wait(10)

    broker_arg = f"127.0.0.1:{broker.port}"
    release = json.loads(signed.stdout)["release"]
    published = await asyncio.to_thread(
        hub,
        "publish",
        release,
        "--group",
        "lab",
        "--trust",
        str(keys / "trust.json"),
        "--broker",
        broker_arg,
        "--json",
    )
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["topics"] == ["edgeagent/group/lab/release/tiny"]

    status = await asyncio.to_thread(hub, "status", "--broker", broker_arg, "--wait", "0.3")
    assert status.returncode == 0 and "0 device(s), 0 online" in status.stdout
    nobody = await asyncio.to_thread(
        hub,
        "rollout",
        release,
        "--group",
        "lab",
        "--broker",
        broker_arg,
        "--release-key",
        str(keys / "release.key"),
    )
    assert nobody.returncode == 2 and "no devices in group 'lab'" in nobody.stderr


@pytest.mark.broker
def test_publish_over_tls_with_a_client_certificate(tmp_path: Path, broker: Broker) -> None:
    keys = tmp_path / "keys"
    assert hub("keygen", str(keys)).returncode == 0
    package = write_tiny_package(tmp_path / "tiny")
    signed = hub(
        "sign",
        str(package),
        "--key",
        str(keys / "release.key"),
        "--out",
        str(tmp_path),
        "--base-url",
        "http://x",
        "--json",
    )
    password = tmp_path / "password"
    password.write_text(broker.tls_settings().password)
    tls = [
        "--broker",
        f"127.0.0.1:{broker.tls_port}",
        "--ca",
        str(broker.pki.ca),
        "--cert",
        str(broker.pki.client_cert),
        "--key",
        str(broker.pki.client_key),
        "--username",
        "device",
        "--password-file",
        str(password),
    ]
    release = json.loads(signed.stdout)["release"]
    trust = ["--trust", str(keys / "trust.json")]
    assert hub("publish", release, "--device", "dev-9", *trust, *tls).returncode == 0
    password.write_text("wrong")
    refused = hub("publish", release, "--device", "dev-9", *trust, *tls)
    assert refused.returncode == 2 and "broker 127.0.0.1" in refused.stderr


def test_usage_errors_name_the_problem(tmp_path: Path) -> None:
    malformed = hub("status", "--broker", "nonsense")
    assert malformed.returncode == 2 and "HOST:PORT" in malformed.stderr
    unreachable = hub("status", "--broker", "127.0.0.1:1")
    assert unreachable.returncode == 2 and "broker 127.0.0.1:1" in unreachable.stderr
    missing = hub("publish", str(tmp_path / "none.release.json"), "--group", "g", "--trust", "t")
    assert missing.returncode == 2 and "cannot read the release" in missing.stderr
    unchecked = hub("publish", str(tmp_path / "none.release.json"), "--group", "g")
    assert unchecked.returncode == 2 and "--trust FILE" in unchecked.stderr
    stages = hub(
        "rollout", str(tmp_path / "x"), "--group", "g", "--stages", "50,20", "--release-key", "k"
    )
    assert stages.returncode == 2 and "--stages: must be increasing" in stages.stderr
    for flag, value in (("--min-executed", "0"), ("--stage-timeout", "inf")):
        refused = hub("rollout", "x", "--group", "g", flag, value, "--release-key", "k")
        assert refused.returncode == 2 and f"{flag}: must be in" in refused.stderr, refused.stderr


def test_stage_sizes_are_cumulative_and_never_empty() -> None:
    assert StagedPolicy((5, 25, 100)).stage_sizes(100) == [5, 25, 100]
    assert StagedPolicy((5, 25, 100)).stage_sizes(3) == [1, 3]
    assert StagedPolicy((5, 25, 100)).stage_sizes(1) == [1]
    with pytest.raises(HubError, match="last stage"):
        StagedPolicy((5, 25))


def test_the_fleet_table_reads_retained_reports() -> None:
    state = {
        "group": "lab",
        "models": {"tiny": {"active_version": "2"}},
        "updates": {
            "last": {
                "model": "tiny",
                "version": "2",
                "result": "succeeded",
                "code": "committed",
                "deployment_id": "d-1",
            }
        },
    }
    rows = [fleet_row("dev-1", state, "online"), fleet_row("dev-2", {}, "offline")]
    table = format_table(rows)
    assert "dev-1" in table and "tiny 2: succeeded (committed)" in table
    assert table.splitlines()[-1] == "2 device(s), 1 online"


def test_rotate_can_reset_floors_and_refuses_a_malformed_reset(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert hub("keygen", str(keys)).returncode == 0
    root = str(keys / "root.key")
    bad = hub("rotate", str(keys / "trust.json"), "--root-key", root, "--reset-floor", "tiny")
    assert bad.returncode == 2 and "MODEL=VERSION" in bad.stderr
    hostile = hub(
        "rotate", str(keys / "trust.json"), "--root-key", root, "--reset-floor", "tiny=1\n"
    )
    assert hostile.returncode == 2 and "floor_resets" in hostile.stderr
    done = hub("rotate", str(keys / "trust.json"), "--root-key", root, "--reset-floor", "tiny=3")
    assert done.returncode == 0, done.stderr
    payload = decode_envelope((keys / "trust.json").read_bytes(), max_bytes=1 << 16).payload
    assert json.loads(payload)["floor_resets"] == {"tiny": "3"}
