"""The daemon's standard error is all log records: a third-party line never appears bare.

Started as an operator starts it (``edgeagent -v run``) on a LiteRT package, so LiteRT's native
code really prints while the model loads; then a PNG whose header claims 10⁸ pixels makes Pillow
raise its ``DecompressionBombWarning`` (the agent refuses the image by its own, lower limit).
"""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import zlib
from pathlib import Path

from devtools.agent_process import spawn_agent
from tests.support.tiny_tflite import write_tiny_litert_package

REPO = Path(__file__).resolve().parents[2]
RECORD = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: "
)


def bomb_png(width: int = 10_000, height: int = 10_000) -> bytes:
    """A PNG header claiming width × height pixels, with no pixels behind it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def post_over_unix(path: Path, target: str, body: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(60)
        conn.connect(str(path))
        conn.sendall(
            f"POST {target} HTTP/1.0\r\nHost: agent\r\nContent-Type: image/png\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return reply


def test_every_stderr_line_of_the_daemon_is_a_log_record(tmp_path: Path) -> None:
    write_tiny_litert_package(tmp_path / "models" / "tiny")
    (tmp_path / "agent.toml").write_text("[server]\ntcp_port = 0\n")
    sock = tmp_path / "agent.sock"
    args = ["--config", "agent.toml", "--models-dir", "models", "--socket", str(sock)]
    log = tmp_path / "daemon.log"
    with log.open("w") as stderr:
        daemon = spawn_agent(
            args,
            options=["-v"],
            state=tmp_path / "state",
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert daemon.stdout is not None
        for line in daemon.stdout:
            if "listening on" in line:
                break
        else:
            raise AssertionError(f"the daemon exited {daemon.wait()}: {log.read_text()}")
        reply = post_over_unix(sock, "/v1/models/tiny/classify", bomb_png())
        assert reply.startswith(b"HTTP/1.0 4") or reply.startswith(b"HTTP/1.1 4"), reply
    finally:
        daemon.terminate()
        assert daemon.wait(60) == 0
        daemon.stdout.close()
    lines = log.read_text().splitlines()
    bare = [line for line in lines if not RECORD.match(line)]
    assert not bare, "\n".join(bare)
    assert any(
        " DEBUG edgeagent.native.litert: INFO: Created TensorFlow Lite XNNPACK delegate" in line
        for line in lines
    )
    warned = [line for line in lines if " WARNING py.warnings: " in line]
    assert any("DecompressionBombWarning" in line for line in warned)
