"""The daemon as a real process: notify, a request over the Unix socket, graceful SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from devtools.agent_process import spawn_agent
from devtools.package import set_fields
from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from tests.support.helpers import REPO, write_tiny_package

# Requests wait this long for company in the batch queue, so they are surely in flight when
# SIGTERM arrives; the drain must still answer them.
QUEUE_DELAY_MS = 1500
DEPTH_SAMPLE = 'edgeagent_queue_depth{model="tiny"}'


class Manager:
    """The service manager's end of NOTIFY_SOCKET: a real datagram socket."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path = path
        self.messages: list[dict[str, str]] = []

    def wait_for(self, key: str, timeout: float, process=None) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(min(1.0, max(0.01, deadline - time.monotonic())))
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                if process is not None and process.poll() is not None:
                    raise AssertionError(
                        f"the daemon exited {process.returncode}: {process.stderr.read()}"
                    ) from None
                continue
            message = dict(line.split("=", 1) for line in data.splitlines())
            self.messages.append(message)
            if key in message:
                return message
        raise AssertionError(f"no {key} notification within {timeout} s: {self.messages}")


def start_daemon(tmp_path: Path, models: Path, sock: Path, manager: Manager) -> subprocess.Popen:
    env = {"NOTIFY_SOCKET": str(manager.path), "WATCHDOG_USEC": "1000000"}
    config = tmp_path / "agent.toml"
    # Always wait the full queue delay, so the requests are queued when SIGTERM comes.
    config.write_text("[server]\nadaptive_batching = false\ndrain_timeout_s = 30\n")
    args = ["--config", str(config)]
    args += ["--models-dir", str(models), "--socket", str(sock), "--port", "0"]
    return spawn_agent(
        args,
        state=tmp_path / "state",
        extra_env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def infer_body(x: np.ndarray) -> dict:
    return {
        "inputs": [
            {
                "name": "input",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.flatten().tolist(),
            }
        ]
    }


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = write_tiny_package(tmp_path / "models" / "tiny")
    set_fields(root, {"serving.max_queue_delay_ms": QUEUE_DELAY_MS, "serving.max_batch_size": 16})
    return root.parent


def test_daemon_lifecycle_ready_serve_drain_exit(tmp_path: Path, models: Path):
    manager = Manager(tmp_path / "notify")
    sock = tmp_path / "run" / "agent.sock"
    process = start_daemon(tmp_path, models, sock, manager)
    try:
        ready = manager.wait_for("READY", timeout=90, process=process)
        assert ready["MAINPID"] == str(process.pid) and str(sock) in ready["STATUS"]
        assert oct(sock.stat().st_mode & 0o777) == oct(0o660)
        manager.wait_for("WATCHDOG", timeout=10)

        rng = np.random.default_rng(7)
        inputs = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(6)]
        answers, refused = asyncio.run(serve_through_sigterm(sock, process, inputs))

        direct = open_variant(load_package(models / "tiny"))
        for x, (status, body) in zip(inputs, answers, strict=True):
            assert status == 200, body
            [output] = body["outputs"]
            expected = direct.run({"input": x})["logits"]
            np.testing.assert_allclose(np.array(output["data"]).reshape(1, 4), expected, rtol=1e-5)
        assert refused, "a new connection was accepted after SIGTERM"
        manager.wait_for("STOPPING", timeout=30)
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
        assert f"listening on {sock}" in stdout and "serving tiny 1" in stdout
        assert not sock.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        manager.sock.close()


async def serve_through_sigterm(sock: Path, process, inputs):
    """Send the requests, SIGTERM while they wait in the queue, then try a new connection."""
    connector = aiohttp.UnixConnector(path=str(sock))
    async with aiohttp.ClientSession(connector=connector) as client:

        async def infer(x):
            async with client.post("http://agent/v2/models/tiny/infer", json=infer_body(x)) as r:
                return r.status, await r.json()

        async with client.get("http://agent/v2/health/ready") as response:
            assert response.status == 200

        async def queue_depth() -> float:
            async with client.get("http://agent/metrics") as response:
                text = await response.text()
            samples = (line.split() for line in text.splitlines())
            return next((float(s[-1]) for s in samples if s[0] == DEPTH_SAMPLE), 0.0)

        tasks = [asyncio.create_task(infer(x)) for x in inputs]
        while not any(t.done() for t in tasks) and await queue_depth() < len(inputs):
            await asyncio.sleep(0.02)
        assert not any(t.done() for t in tasks), "answered before SIGTERM: the test proves nothing"
        process.send_signal(signal.SIGTERM)
        refused = False  # must turn true while the queued requests are still being drained
        while not refused and not all(t.done() for t in tasks):
            try:
                _, writer = await asyncio.open_unix_connection(str(sock))
                writer.close()
                await asyncio.sleep(0.02)
            except OSError:
                refused = True
        return await asyncio.gather(*tasks), refused


def test_port_in_use_is_a_clear_start_failure(tmp_path: Path, models: Path):
    manager = Manager(tmp_path / "notify")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONPATH": str(REPO)}
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "edgeagent.cli",
                "run",
                "--models-dir",
                str(models),
                "--socket",
                str(tmp_path / "a.sock"),
                "--port",
                str(port),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    finally:
        busy.close()
        manager.sock.close()
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port" in result.stderr
    assert not (tmp_path / "a.sock").exists()
