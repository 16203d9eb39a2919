"""``status``/``health``/``infer --url`` send the user token, never the admin token, and on
loopback only to a listener that root, the caller or the agent's user owns.

With the agent stopped or restarting, any local user may bind 127.0.0.1:8080. A command reading
the config's tokens hands a TCP listener the least it can use (the user scope every read needs),
so the admin token that can change what the device serves never leaves the config; and on
loopback the kernel names the port's owner, so another user's listener gets no token at all.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgeagent.cli import main
from edgeagent.commands.peer import listener_uids

USER, ADMIN = "user-token-1", "admin-token-2"


class _Squatter(http.server.BaseHTTPRequestHandler):
    """Answers like an agent and keeps every Authorization header it is sent."""

    seen: list[str] = []
    body: bytes | None = None  # what to answer instead of a status document

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization", ""))
        body = b"" if self.path == "/metrics" else json.dumps({"agent": {}}).encode()
        body = type(self).body if type(self).body is not None else body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _squatter() -> Iterator[str]:
    _Squatter.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Squatter)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Both tokens in files, as docs/security/secrets.md recommends."""
    monkeypatch.delenv("EDGEAGENT_TOKEN", raising=False)
    (tmp_path / "token").write_text(USER + "\n")
    (tmp_path / "admin-token").write_text(ADMIN + "\n")
    path = tmp_path / "agent.toml"
    path.write_text(
        f'[server]\ntoken_file = "{tmp_path / "token"}"\n'
        f'admin_token_file = "{tmp_path / "admin-token"}"\n'
    )
    return path


@pytest.mark.parametrize("command", [["status", "--json"], ["health"]])
def test_a_tcp_listener_gets_the_user_token_never_the_admin_token(
    config: Path, command: list[str]
) -> None:
    with _squatter() as url:
        code = main([*command, "--url", url, "--config", str(config)])
    assert code == 0  # it answered as an agent would: the command could not tell
    assert _Squatter.seen and set(_Squatter.seen) == {f"Bearer {USER}"}
    assert not any(ADMIN in header for header in _Squatter.seen)


def test_with_only_an_admin_token_configured_no_token_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGEAGENT_TOKEN", raising=False)
    path = tmp_path / "agent.toml"
    path.write_text(f'[server]\nadmin_token = "{ADMIN}"\n')
    with _squatter() as url:
        assert main(["health", "--url", url, "--config", str(path)]) == 0
    assert _Squatter.seen == [""]


def test_an_explicit_token_is_what_the_operator_chose(config: Path) -> None:
    """The control: --token is sent as given (the operator picked the credential and peer)."""
    with _squatter() as url:
        assert main(["health", "--url", url, "--config", str(config), "--token", "given"]) == 0
    assert _Squatter.seen == ["Bearer given"]


SQUATTER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("GOT", self.headers.get("Authorization", ""), flush=True)
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
server = http.server.HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
SYSTEM_PYTHON = Path("/usr/bin/python3")  # another uid cannot run a python under /root


@pytest.mark.skipif(
    os.geteuid() != 0 or not SYSTEM_PYTHON.exists(), reason="a listener of another uid needs root"
)
def test_a_loopback_port_another_user_holds_gets_no_token(config: Path) -> None:
    def become_another_user() -> None:
        os.setgid(12345)
        os.setuid(12345)

    squatter = subprocess.Popen(
        [str(SYSTEM_PYTHON), "-c", SQUATTER], stdout=subprocess.PIPE, text=True, cwd="/",
        preexec_fn=become_another_user,
    )  # fmt: skip
    try:
        assert squatter.stdout is not None
        port = int(squatter.stdout.readline())
        assert listener_uids(port) == {12345}
        codes = [
            main([*command, "--url", f"http://127.0.0.1:{port}", "--config", str(config)])
            for command in (["health"], ["status"])
        ]
    finally:
        squatter.kill()
        heard, _ = squatter.communicate(timeout=30)
    assert codes == [1, 2]  # health's and status's exit for a refused connection
    assert "GOT" not in heard  # it was never even asked


def test_a_loopback_port_this_user_holds_is_trusted(config: Path) -> None:
    """The control of the test above: the kernel names us, and the token is sent."""
    with _squatter() as url:
        assert listener_uids(int(url.rsplit(":", 1)[1])) == {os.geteuid()}
        assert main(["health", "--url", url, "--config", str(config)]) == 0
    assert _Squatter.seen == [f"Bearer {USER}"]


def _table(tmp_path: Path, name: str, rows: list[tuple[str, str, int]]) -> Path:
    path = tmp_path / name
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    path.write_text(
        head
        + "".join(
            f"   {i}: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 "
            f"{uid} 0 {1000 + i} 1\n"
            for i, (local, state, uid) in enumerate(rows)
        )
    )
    return path


def test_the_kernel_tables_name_the_owners_of_a_ports_loopback_listeners(tmp_path: Path) -> None:
    """Rows as a little-endian kernel prints them: port 8080 is 1F90."""
    if sys.byteorder != "little":
        pytest.skip("the rows below are a little-endian kernel's")
    v4 = _table(tmp_path, "tcp", [
        ("0100007F:1F90", "0A", 1001),  # 127.0.0.1:8080, listening
        ("00000000:1F90", "0A", 1002),  # 0.0.0.0:8080 takes loopback connections too
        ("0100A8C0:1F90", "0A", 1003),  # 192.168.0.1:8080 does not
        ("0100007F:1F90", "01", 1004),  # an established connection, not a listener
        ("0100007F:1F91", "0A", 1005),  # another port
    ])  # fmt: skip
    v6 = _table(tmp_path, "tcp6", [
        ("00000000000000000000000001000000:1F90", "0A", 1006),  # ::1
        ("0000000000000000FFFF00000100007F:1F90", "0A", 1007),  # ::ffff:127.0.0.1
        ("B80D0120000000000000000001000000:1F90", "0A", 1008),  # 2001:db8::1
    ])  # fmt: skip
    assert listener_uids(8080, (v4, v6)) == {1001, 1002, 1006, 1007}
    assert listener_uids(8080, (tmp_path / "absent",)) is None


def test_a_listener_answering_garbage_is_an_error_not_a_traceback(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _squatter() as url:
        _Squatter.body = b"hello"
        try:
            code = main(["status", "--url", url, "--config", str(config)])
        finally:
            _Squatter.body = None
    assert code == 1 and "not a JSON document: b'hello'" in capsys.readouterr().err
