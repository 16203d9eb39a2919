"""``status``/``health``/``infer --url`` send the user token, never the admin token.

Nothing proves that what listens on a TCP port is the agent: with the agent stopped or
restarting, any local user may bind 127.0.0.1:8080. A command reading the config's tokens must
therefore hand such a listener the least it can use (the user scope every read needs), and the
admin token that can change what the device serves never leaves the config.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgeagent.cli import main

USER, ADMIN = "user-token-1", "admin-token-2"


class _Squatter(http.server.BaseHTTPRequestHandler):
    """Answers like an agent and keeps every Authorization header it is sent."""

    seen: list[str] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization", ""))
        body = b"" if self.path == "/metrics" else json.dumps({"agent": {}}).encode()
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
