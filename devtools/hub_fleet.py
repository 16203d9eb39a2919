"""Test doubles for the hub server: signed releases, simulated devices, a running server.

A ``FakeDevice`` speaks the real wire protocol — its state report and outcome events are
built by the agent's own ``UpdateReporter``, on the topics of ``fleet.topics.Topics`` — but
"installs" a release by deciding its answer (``answer``), optionally waiting for ``hold``
first, so a test can stop the world in the middle of a stage. An agent release is answered as
a real device answers one: ``succeeded``/``committed`` (what the new agent reports after its
restart) or ``failed``/``health_check_failed`` (what the old one reports once its boot check
rolled the switch back); ``platform`` / ``python`` report another board's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from devtools.background import WatchedTasks
from edgeagent.aio import cancel_and_wait
from edgeagent.fleet import cancel
from edgeagent.fleet.agent_manifest import AgentManifest, claimed_kind
from edgeagent.fleet.manifest import Artifact, ReleaseManifest, VariantArtifact
from edgeagent.fleet.mqtt import client_options
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.signing import sign_envelope
from edgeagent.fleet.topics import Topics
from edgeagent.hub.release_checks import AnyRelease, model_of, read_manifest
from edgeagent.hub.server.service import serve
from edgeagent.hub.server.settings import ServerSettings
from edgeagent.updates.report import UpdateReporter

SIGNING_KEY = Ed25519PrivateKey.generate()
MODEL = "mobilenet_v2"


def make_release(version: str, model: str = MODEL, *, serial: int | None = None) -> bytes:
    """A signed release envelope, as ``hub sign`` writes it (``serial``: one that does not
    follow the version, as a release signed again has)."""
    issued = datetime.now(timezone.utc).replace(microsecond=0)
    manifest = ReleaseManifest(
        model=model,
        version=version,
        serial=_serial(version) if serial is None else serial,
        artifact=Artifact(
            url=f"http://127.0.0.1:9/{model}-{version}.tar.gz",
            size=1000,
            sha256=hashlib.sha256(version.encode()).hexdigest(),
        ),
        variants=(
            VariantArtifact(
                "onnxruntime",
                "int8",
                Artifact(
                    url=f"http://127.0.0.1:9/{model}-{version}.onnxruntime.int8.tar.gz",
                    size=1000,
                    sha256=hashlib.sha256(f"{version}.int8".encode()).hexdigest(),
                ),
            ),
        ),
        issued_at=issued,
        expires=issued + timedelta(days=1),
        deployment_id=f"{model}-{version}-test",
    )
    return sign_envelope(manifest.to_payload(), [SIGNING_KEY])


def _serial(version: str) -> int:
    """A serial that grows with the version, as the hub's per-model counter would."""
    major, minor, patch = (int(part) for part in [*version.split("."), "0", "0"][:3])
    return major * 1_000_000 + minor * 1_000 + patch + 1


class FakeDevice:
    def __init__(
        self,
        settings: MqttSettings,
        device_id: str,
        group: str,
        *,
        profile: str = "generic-x86_64",
        version: str = "1.0.0",
        answer: str = "succeeded",
        hold: asyncio.Event | None = None,
        lose_events: bool = False,
        platform: str | None = None,
        python: str | None = None,
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix, group, device_id)
        self.profile = profile
        self.version = version
        self.answer = answer  # succeeded | failed | silent
        self.hold = hold
        self.lose_events = lose_events  # as if the broker dropped them: only the state tells
        self.received: list[AnyRelease] = []
        self.envelopes: list[bytes] = []  # the bytes of each, as the broker delivered them
        self.cancellations: list[bytes] = []  # the hub's, which this fake only records
        self.got_cancellation = asyncio.Event()
        self.got_release = asyncio.Event()
        self.answered = asyncio.Event()  # its outcome event was acknowledged by the broker
        self.reporter = UpdateReporter(
            device_id,
            group,
            sources={
                "profile": lambda: {
                    "profile": self.profile,
                    "board": {"model": "Test Board 4", "arch": "x86_64"},
                },
                "models": lambda: {
                    MODEL: {
                        "state": "READY",
                        "active_version": self.version,
                        "versions": {
                            self.version: {
                                "runtime": "onnxruntime",
                                "device": "CPUExecutionProvider",
                                "precision": "int8",
                            }
                        },
                    }
                },
                "governor": lambda: {
                    "state": "normal",
                    "temperatures": [{"sensor": "cpu-thermal", "celsius": 51.5}],
                    "power": {"total_w": 4.25},
                },
            },
        )
        if platform is not None:  # another board's ("": an agent too old to report one)
            self.reporter.platform = platform
        if python is not None:
            self.reporter.python = python
        self._outbox: list[tuple[str, dict[str, Any]]] = []
        self.reporter.connect(
            lambda state: self._outbox.append((self.topics.state, state)),
            lambda event: self._outbox.append((self.topics.events, event)),
        )
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Connect, say online, publish the retained state; acknowledged before returning."""
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        self._client = aiomqtt.Client(
            **client_options(self.settings, f"fake-{self.topics.device_id}"),
            will=aiomqtt.Will(self.topics.availability, b"offline", qos=1, retain=True),
            clean_start=False,
            properties=properties,
        )
        await self._client.__aenter__()
        await self._client.subscribe(self.topics.device_release, qos=1)
        await self._client.publish(self.topics.availability, b"online", qos=1, retain=True)
        await self._flush()
        self._task = asyncio.create_task(self._listen())

    async def report(self) -> None:
        """Publish a fresh state report (after a test changed what the device runs)."""
        self.reporter.refresh()
        await self._flush()

    async def _flush(self) -> None:
        assert self._client is not None
        while self._outbox:
            topic, message = self._outbox.pop(0)
            if self.lose_events and topic == self.topics.events:
                continue
            await self._client.publish(
                topic, json.dumps(message), qos=1, retain=topic == self.topics.state
            )

    async def _listen(self) -> None:
        assert self._client is not None
        async for message in self._client.messages:
            envelope = bytes(message.payload)  # type: ignore[arg-type]
            if claimed_kind(envelope, 65536) == cancel.KIND:
                self.cancellations.append(envelope)
                self.got_cancellation.set()
                continue
            manifest = read_manifest(envelope, max_bytes=65536)
            self.envelopes.append(envelope)
            self.received.append(manifest)
            self.got_release.set()
            if self.hold is not None:
                await self.hold.wait()
            release = {
                "model": model_of(manifest),
                "version": manifest.version,
                "deployment_id": manifest.deployment_id,
            }
            if self.answer == "silent":
                continue
            agent = isinstance(manifest, AgentManifest)
            if self.answer == "succeeded" and agent:
                self.reporter.outcome(release, "succeeded", "committed", "READY, healthy")
            elif self.answer == "succeeded":
                self.version = manifest.version
                self.reporter.outcome(release, "succeeded", "installed", "ok")
            elif agent:
                self.reporter.outcome(release, "failed", "health_check_failed", "rolled back")
            else:
                self.reporter.outcome(release, "failed", "health_check", "golden mismatch")
            await self._flush()
            self.answered.set()

    async def stop(self) -> None:
        """Say "offline" and leave, as the agent does on a graceful stop."""
        if self._client is not None:
            with contextlib.suppress(aiomqtt.MqttError):
                await self._client.publish(self.topics.availability, b"offline", qos=1, retain=True)
        if self._task is not None:  # answering a release: one cancel may be lost (aio)
            await cancel_and_wait([self._task])
        if self._client is not None:
            with contextlib.suppress(aiomqtt.MqttError, asyncio.TimeoutError):
                await asyncio.wait_for(self._client.__aexit__(None, None, None), 5)


@contextlib.asynccontextmanager
async def fleet(
    settings: MqttSettings,
    count: int,
    group: str = "lab",
    *,
    failing: int = 0,
    name: str = "dev",
    **options: Any,
) -> AsyncIterator[list[FakeDevice]]:
    """``count`` devices ``dev-000``…; the first ``failing`` answer every release "failed"."""
    devices = [
        FakeDevice(
            settings,
            f"{name}-{i:03d}",
            group,
            **({"answer": "failed"} if i < failing else {}),
            **options,
        )
        for i in range(count)
    ]
    await asyncio.gather(*(d.start() for d in devices))
    try:
        yield devices
    finally:
        await asyncio.gather(*(d.stop() for d in devices))


@contextlib.asynccontextmanager
async def hub_server(database_url: str, mqtt: MqttSettings, **overrides: Any) -> AsyncIterator[str]:
    """The hub server in this process on a free loopback port; yields its URL.

    ``--open`` unless the test brings a ``token_file`` (or a ``state_dir`` for the generated
    admin token): never a token made in the user's own state directory."""
    auth = {} if {"token_file", "state_dir"} & overrides.keys() else {"open": True}
    settings = replace(
        ServerSettings(database_url=database_url, port=0, mqtt=mqtt, **auth), **overrides
    )
    stop = asyncio.Event()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    # A hub that dies mid-test (a background job raised) cancels the test at once and the
    # block raises its error, instead of the test waiting on devices that will never hear.
    async with WatchedTasks() as watched:
        task = watched.spawn(
            serve(settings, ready=started.set_result, stop=stop, client_id="hub-under-test"),
            "hub server",
        )
        done, _ = await asyncio.wait([started, task], return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # it failed to start: raise its error here
        try:
            yield started.result()
        finally:
            stop.set()
            await asyncio.wait([task])


@contextlib.asynccontextmanager
async def signing_hub(
    database_url: str, mqtt: MqttSettings, release_key: Path, trust_file: Path
) -> AsyncIterator[Api]:
    """``hub_server`` with a release key (it signs what it sends); yields its API once the
    server has read the broker's retained reports."""
    async with hub_server(
        database_url, mqtt, release_keys=(release_key,), trust_file=trust_file
    ) as url:
        api = Api(url)
        await api.synced()
        yield api


class HubProcess:
    """``edgeagent hub server`` as its own process (what an operator runs)."""

    def __init__(
        self,
        database_url: str,
        mqtt: MqttSettings,
        *extra: str,
        auth: tuple[str, ...] = ("--open",),
    ) -> None:
        """``auth``: the server's token options (``--open`` unless a test brings its own)."""
        self.command = [
            sys.executable,
            "-m",
            "edgeagent.cli",
            "hub",
            "server",
            "--db",
            database_url,
            "--port",
            "0",
            "--broker",
            f"{mqtt.host}:{mqtt.port}",
            "--client-id",
            "hub-process-under-test",
            *auth,
            *extra,
        ]
        self.process: subprocess.Popen[str] | None = None
        self.output: list[str] = []  # what it printed up to "listening on"

    async def start(self) -> str:
        """Start it and return its URL once it printed that it listens."""
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        output = self.output
        while True:
            line = await asyncio.to_thread(self.process.stdout.readline)  # type: ignore[union-attr]
            if not line:
                raise RuntimeError("hub server exited:\n" + "".join(output))
            output.append(line)
            if line.startswith("hub server listening on "):
                return line.split()[-1]

    def stop(self, sig: int) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(30)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return code


class Api:
    """The REST API over loopback, as any client would call it."""

    def __init__(self, url: str, token: str = "") -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def call(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        async with (
            aiohttp.ClientSession(headers=self.headers) as session,
            session.request(method, f"{self.url}{path}", **kwargs) as response,
        ):
            body = await response.json(content_type=None)
            assert response.status == expect, (response.status, body)
            return body

    async def synced(self) -> dict[str, Any]:
        health = await self.call("GET", "/api/v1/health?wait=30")
        assert health["synced"], health
        return health

    async def deploy(self, version: str, **body: Any) -> dict[str, Any]:
        """Upload the test release of ``version`` and create a deployment of it to group lab."""
        await self.call("POST", "/api/v1/releases", expect=201, data=make_release(version))
        request = {"model": MODEL, "version": version, "group": "lab", **body}
        return await self.call("POST", "/api/v1/deployments", expect=201, json=request)

    async def all_devices(self, deployment: dict[str, Any], page: int = 1000) -> dict[str, Any]:
        """``deployment`` with every device row, read page by page (the API pages them)."""
        rows: list[dict[str, Any]] = []
        while len(rows) < deployment["device_count"]:
            found = await self.call(
                "GET", f"/api/v1/deployments/{deployment['id']}?limit={page}&offset={len(rows)}"
            )
            if not found["devices"]:
                break
            rows += found["devices"]
        return {**deployment, "devices": rows}

    async def until(self, deployment_id: str, *states: str) -> dict[str, Any]:
        """Long-poll the deployment until it reaches one of ``states``."""
        path = f"/api/v1/deployments/{deployment_id}"
        return await self.long_poll(path, lambda found: found["state"] in states)

    async def long_poll(self, path: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """GET ``path`` until ``done`` holds, each time asking the hub to answer only once the
        resource changed (``wait``/``after`` version): no sleeps, no missed change."""
        found = await self.call("GET", path)
        while not done(found):
            found = await self.call("GET", f"{path}?wait=30&after={found['version']}")
        return found


def write_tokens(path: Path, **scopes: str) -> Path:
    path.write_text("".join(f"{scope} {token}\n" for scope, token in scopes.items()))
    return path
