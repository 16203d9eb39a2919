"""The agent a benchmark measures: one pinned package, ready when ``/v2/health/ready`` answers.

``start_daemon`` writes the config a benchmark needs (thread count, a token, gRPC with the
peers) and starts the agent through ``devtools.agent_process.spawn_agent``; ``wait_ready``
turns a daemon that exits or fails to load its model into a clear SystemExit; ``stop_tree``
stops it, or a peer's server with its workers.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

from devtools.agent_process import spawn_agent
from devtools.http_endpoint import http_client
from devtools.ports import free_port
from devtools.waiting import until
from edgeagent.models.device_key import open_device_key


@dataclass
class Daemon:
    """The edgeagent daemon under test and where it listens."""

    process: subprocess.Popen
    sock: Path
    tcp_port: int  # 0: no TCP listener
    grpc_port: int  # 0: no gRPC
    grpc_sock: Path
    token: str  # [server] token: what TCP requests (HTTP and gRPC) must carry


def start_daemon(
    package_dir: Path,
    work: Path,
    threads: int,
    peers: bool = False,
    server: str = "",
    tables: str = "",
) -> Daemon:
    """``edgeagent run`` on just this package; ``threads`` = [hardware] threads (0: all cores).

    With ``peers`` it also listens on TCP and serves gRPC (TCP and its own Unix socket);
    ``server`` holds extra lines of its [server] table, ``tables`` whole tables ([tls] …).
    """
    tcp_port = free_port() if peers else 0
    grpc_port = free_port() if peers else 0
    grpc_sock = work / "grpc.sock"
    config = work / "agent.toml"
    token = secrets.token_hex(16)
    text = f"[hardware]\nthreads = {threads}\n[server]\ntoken = '{token}'\n"
    if server:
        text += f"{server}\n"
    if peers:
        text += f"[grpc]\nenabled = true\nport = {grpc_port}\nunix_socket = '{grpc_sock}'\n"
    config.write_text(text + tables)
    models = work / "models"
    models.mkdir()
    (models / package_dir.name).symlink_to(package_dir.resolve())
    sock = work / "agent.sock"
    # A provisioned device: its key pair exists. Only the first start creates it, and that
    # start alone loads the crypto library (7 MB) that an agent without sealed models needs not.
    open_device_key(work / "state" / "edgeagent")
    args = ["--config", str(config), "--models-dir", str(models)]
    args += ["--socket", str(sock), "--port", str(tcp_port)]
    process = spawn_agent(
        args,
        state=work / "state",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
    )
    return Daemon(process, sock, tcp_port, grpc_port, grpc_sock, token)


async def wait_ready(sock: Path, process: subprocess.Popen, timeout: float = 300) -> dict:
    """The daemon's /v1/status once it is ready; SystemExit when it exits or a model fails."""
    status: dict = {}

    async def ready() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"the daemon exited with {process.returncode}")
        try:
            async with http_client(sock) as client:
                async with client.get("/v2/health/ready") as response:
                    if response.status == 200:
                        async with client.get("/v1/status") as answer:
                            status.update(await answer.json())
                        return True
                async with client.post("/v2/repository/index") as index:
                    failed = [m for m in await index.json() if m["state"] == "UNAVAILABLE"]
                if failed:  # it listens only after loading: this model will not come
                    raise SystemExit(f"the daemon could not load a model: {failed}")
        except (aiohttp.ClientError, OSError):
            pass
        return False

    try:
        await until(ready, timeout, poll_s=0.02)  # fine enough to time start → ready
    except AssertionError:
        raise SystemExit("the daemon did not become ready") from None
    return status


async def wait_plan(sock: Path, model: str, timeout: float = 120) -> dict:
    """The daemon's /v1/status once ``model``'s execution plan is no longer pending (the
    search after serving has swapped its plan in): what the measured rows must run on."""
    status: dict = {}

    async def settled() -> bool:
        async with http_client(sock) as client, client.get("/v1/status") as answer:
            status.clear()
            status.update(await answer.json())
        versions = status["models"][model]["versions"]
        return all(v.get("plan", {}).get("source") != "pending" for v in versions.values())

    try:
        await until(settled, timeout, poll_s=0.02)
    except AssertionError:
        raise SystemExit("the daemon's execution plan search did not end") from None
    return status


def stop_tree(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL for the process and its children (MLServer's workers) if it hangs."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:  # orphaned workers of a server that died or hung
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
