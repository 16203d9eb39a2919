"""``edgeagent status`` never talks to a squatter's socket (issue 23 finding 8).

Any user can create ``/tmp/edgeagent-<uid>`` before the agent starts; the daemon then refuses to
listen there, and the client must equally refuse to connect: a squatter listening in it would
otherwise have its answers printed as the agent's. The squatter here serves a status document
naming itself and counts the connections it gets.
"""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.helpers import REPO


class _Squatter(http.server.BaseHTTPRequestHandler):
    connections = 0

    def do_GET(self) -> None:
        type(self).connections += 1
        body = json.dumps({"agent": {"version": "SQUATTER"}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextmanager
def _squatting(sock: Path, owner: int | None = None) -> Iterator[type[_Squatter]]:
    _Squatter.connections = 0
    server = _UnixServer(str(sock), _Squatter)
    if owner is not None:
        os.chown(sock, owner, owner)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield _Squatter
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _status(sock: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "edgeagent.cli", "status", "--socket", str(sock), "--json"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def _shared_tmp(tmp_path: Path) -> Path:
    """A directory like /tmp: every user may create entries in it (sticky)."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory owned by another user needs root")
def test_a_directory_another_user_made_under_tmp_is_refused(tmp_path: Path) -> None:
    planted = _shared_tmp(tmp_path) / f"edgeagent-{os.geteuid()}"
    planted.mkdir(mode=0o700)
    sock = planted / "agent.sock"
    with _squatting(sock, owner=12345) as squatter:
        os.chown(planted, 12345, 12345)
        result = _status(sock)
    assert result.returncode == 2, result.stdout
    assert "SQUATTER" not in result.stdout
    assert f"{planted} belongs to uid 12345" in result.stderr
    assert squatter.connections == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a socket owned by another user needs root")
def test_another_users_socket_in_a_sticky_directory_is_refused(tmp_path: Path) -> None:
    sock = _shared_tmp(tmp_path) / "agent.sock"
    with _squatting(sock, owner=12345) as squatter:
        result = _status(sock)
    assert result.returncode == 2 and f"{sock} belongs to uid 12345" in result.stderr
    assert squatter.connections == 0


def test_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    sock = loose / "agent.sock"
    with _squatting(sock) as squatter:
        result = _status(sock)
    assert result.returncode == 2 and "writable by other users" in result.stderr
    assert squatter.connections == 0


def test_a_symbolic_link_for_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with _squatting(tmp_path / "real" / "agent.sock") as squatter:
        result = _status(tmp_path / "link" / "agent.sock")
    assert result.returncode == 2 and "not a plain directory" in result.stderr
    assert squatter.connections == 0


def test_our_own_directory_is_trusted(tmp_path: Path) -> None:
    """The control: the same server in a directory of our own is asked and answers."""
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    with _squatting(own / "agent.sock") as squatter:
        result = _status(own / "agent.sock")
    assert result.returncode == 0, result.stderr
    assert "SQUATTER" in result.stdout and squatter.connections >= 1
