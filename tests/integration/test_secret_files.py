"""Tokens kept out of agent.toml (token_file, systemd credentials), and the warning when a file
holding a secret is readable by others: `config check`, the daemon at start, the parsed config."""

from __future__ import annotations

import dataclasses
import grp
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from devtools.agent_process import spawn_agent
from devtools.ports import free_port
from edgeagent.api.secret_files import ADMIN_TOKEN_CREDENTIAL, TOKEN_CREDENTIAL, exposure
from edgeagent.config import parse_config
from edgeagent.sections import ConfigError
from tests.support.helpers import REPO, write_tiny_package


def config_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "config", "check", str(path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def secret(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_token_file_is_read_stripped_and_survives_a_copy(tmp_path: Path) -> None:
    token = secret(tmp_path / "token", "  s3cret-token\n", 0o600)
    config = parse_config(f'[server]\ntoken_file = "{token}"\n')
    assert config.server.token == "s3cret-token"
    assert dataclasses.replace(config.server, tcp_port=0).token == "s3cret-token"  # run's flags


@pytest.mark.parametrize(
    ("content", "mode", "problem"),
    [(None, 0o600, "does not exist"), ("\n \n", 0o600, "is empty"),
     (b"\xff\xfe", 0o600, "is not UTF-8 text")],
)  # fmt: skip
def test_a_bad_token_file_is_named(tmp_path: Path, content, mode: int, problem: str) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as caught:
        parse_config(f'[server]\nadmin_token_file = "{path}"\n')
    assert caught.value.problems == [f"<config>: [server] admin_token_file: {path} {problem}"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_token_file_is_named(tmp_path: Path) -> None:
    path = secret(tmp_path / "token", "x", 0o000)
    with pytest.raises(ConfigError, match="cannot read .*Permission denied"):
        parse_config(f'[server]\ntoken_file = "{path}"\n')


def test_a_token_both_inline_and_in_a_file_is_refused(tmp_path: Path) -> None:
    path = secret(tmp_path / "token", "from-file", 0o600)
    with pytest.raises(ConfigError, match=r"\[server\] token: is set here and in token_file"):
        parse_config(f'[server]\ntoken = "inline"\ntoken_file = "{path}"\n')


def test_systemd_credentials_are_the_token_files(tmp_path: Path, monkeypatch) -> None:
    secret(tmp_path / TOKEN_CREDENTIAL, "cred-token\n", 0o400)
    secret(tmp_path / ADMIN_TOKEN_CREDENTIAL, "cred-admin\n", 0o400)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    server = parse_config("").server
    assert (server.token, server.admin_token) == ("cred-token", "cred-admin")
    assert server.token_file == tmp_path / TOKEN_CREDENTIAL


def test_exposure_names_the_file_and_the_command(tmp_path: Path) -> None:
    path = secret(tmp_path / "token", "x", 0o644)
    assert exposure(path, os.getegid()) == (
        f"{path} holds a secret and every local user can read it (mode 0644): "
        f"run chmod o-rwx {path}"
    )
    path.chmod(0o640)
    assert exposure(path, os.getegid()) is None  # the agent's own group may
    other = os.getegid() + 1
    mine = grp.getgrgid(os.getegid()).gr_name
    warning = str(exposure(path, other))
    assert f"group {mine} can read it (mode 0640)" in warning
    assert warning.endswith(f"or chmod g-rwx {path}")
    path.chmod(0o600)
    assert exposure(path, other) is None


def test_config_check_warns_about_a_world_readable_config_holding_a_token(
    tmp_path: Path,
) -> None:
    config = secret(tmp_path / "agent.toml", '[server]\ntoken = "abc"\n', 0o644)
    result = config_check(config)
    assert result.returncode == 0, result.stderr  # usable: a warning, not a refusal
    assert f"warning: {config} holds a secret and every local user can read it" in result.stderr
    assert f"chmod o-rwx {config}" in result.stderr
    config.chmod(0o640)
    assert "warning" not in config_check(config).stderr
    tokenless = secret(tmp_path / "plain.toml", "[server]\ntcp_port = 0\n", 0o644)
    assert "warning" not in config_check(tokenless).stderr  # nothing secret in it


def test_config_check_warns_about_a_readable_token_file_and_not_its_config(
    tmp_path: Path,
) -> None:
    token = secret(tmp_path / "token", "abc\n", 0o644)
    config = secret(tmp_path / "agent.toml", f'[server]\ntoken_file = "{token}"\n', 0o644)
    result = config_check(config)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        f"warning: {token} holds a secret and every local user can read it (mode 0644): "
        f"run chmod o-rwx {token}\n"
    )


def test_config_check_names_a_missing_token_file(tmp_path: Path) -> None:
    config = secret(tmp_path / "agent.toml", '[server]\ntoken_file = "/nonexistent/t"\n', 0o600)
    result = config_check(config)
    assert result.returncode == 2
    assert "[server] token_file: /nonexistent/t does not exist" in result.stderr


def test_the_daemon_serves_tcp_with_the_credential_and_warns_about_a_readable_token(
    tmp_path: Path,
) -> None:
    """The unit's LoadCredential= path end to end: $CREDENTIALS_DIRECTORY → TCP bearer token;
    and the start-up warning for a token file every user can read."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    secret(credentials / TOKEN_CREDENTIAL, "cred-token\n", 0o400)
    admin = secret(tmp_path / "admin-token", "admin-secret\n", 0o644)
    models = write_tiny_package(tmp_path / "models" / "tiny").parent
    config = secret(
        tmp_path / "agent.toml",
        f'[agent]\nmodels_dir = "{models}"\n[server]\nadmin_token_file = "{admin}"\n',
        0o600,
    )
    log = serve_once(config, tmp_path, "cred-token", {"CREDENTIALS_DIRECTORY": str(credentials)})
    assert f"{admin} holds a secret and every local user can read it" in log
    assert "chmod o-rwx" in log


def test_the_daemon_warns_about_its_own_world_readable_config(tmp_path: Path) -> None:
    models = write_tiny_package(tmp_path / "models" / "tiny").parent
    config = secret(
        tmp_path / "agent.toml",
        f'[agent]\nmodels_dir = "{models}"\n[server]\ntoken = "inline-token"\n',
        0o644,
    )
    log = serve_once(config, tmp_path, "inline-token", {})
    assert f"{config} holds a secret and every local user can read it" in log


def serve_once(config: Path, tmp_path: Path, token: str, extra_env: dict[str, str]) -> str:
    """Run ``edgeagent run --config`` until it serves, answer one TCP request with ``token``,
    stop it, and return its log (it must exit cleanly)."""
    port = free_port()
    agent = spawn_agent(
        ["--config", str(config), "--socket", str(tmp_path / "agent.sock"), "--port", str(port)],
        state=tmp_path / "state", extra_env=extra_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert agent.stdout is not None
        first = agent.stdout.readline()  # printed once the agent serves
        assert first.startswith("edgeagent serving tiny 1"), first
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/health/ready",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
    finally:
        agent.terminate()
        _, log = agent.communicate(timeout=60)
    assert agent.returncode == 0, log
    return log
