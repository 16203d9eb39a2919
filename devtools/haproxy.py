"""HAProxy from Debian in front of agents on loopback: the load balancer of the replica tests.

One frontend on a free loopback port; one backend whose servers are health-checked with
``GET /v2/health/ready`` (with the agents' token) every ``check_interval_ms``, a server that
fails one check leaving the rotation and one that passes one check rejoining it. A request
whose connection is refused, or closed before any answer (a replica that stopped accepting),
is retried on another server (``retry-on conn-failure empty-response``, ``option
redispatch``): what an operator's HAProxy in front of replicas needs for a stop to lose
nothing.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from devtools.ports import free_port


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )


def haproxy_config(
    port: int, servers: list[int], token: str, stats: Path, check_interval_ms: int = 100
) -> str:
    lines = [
        "global",
        "  maxconn 512",
        f"  stats socket {stats} mode 600 level admin",
        "defaults",
        "  mode http",
        "  timeout connect 2s",
        "  timeout client 60s",
        "  timeout server 60s",
        "  retries 3",
        "  option redispatch",
        "  retry-on conn-failure empty-response",
        "frontend agents",
        f"  bind 127.0.0.1:{port}",
        "  default_backend replicas",
        "backend replicas",
        "  balance leastconn",
        "  option httpchk",
        f'  http-check send meth GET uri /v2/health/ready hdr Authorization "Bearer {token}"',
        "  http-check expect status 200",
        f"  default-server inter {check_interval_ms} fall 1 rise 1",
        *(f"  server r{i} 127.0.0.1:{p} check" for i, p in enumerate(servers)),
    ]
    return "\n".join(lines) + "\n"


class HAProxy:
    """``haproxy -db`` in the foreground with the config above; ``url`` is its frontend."""

    def __init__(self, root: Path, servers: list[int], token: str) -> None:
        binary = haproxy_binary()
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (apt-get install haproxy)")
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.stats = root / "haproxy.sock"
        self.config = root / "haproxy.cfg"
        self.config.write_text(haproxy_config(self.port, servers, token, self.stats))
        check = subprocess.run([binary, "-c", "-f", str(self.config)], capture_output=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its config: {check.stderr.decode()}")
        self.log = root / "haproxy.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def show_stat(self) -> list[dict[str, str]]:
        """HAProxy's own counters per proxy and server (``show stat`` on its admin socket)."""
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(self.stats))
            client.sendall(b"show stat\n")
            data = b""
            while chunk := client.recv(65536):
                data += chunk
        header, *rows = data.decode().strip().splitlines()
        names = header.lstrip("# ").split(",")
        return [dict(zip(names, row.split(","), strict=False)) for row in rows]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
