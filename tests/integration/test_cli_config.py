"""`edgeagent config check|show` as an operator runs them: real processes, files, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edgeagent.config import TABLE_ARRAYS, describe_config
from tests.support.helpers import REPO, write_tiny_package
from tests.support.toy_detector import write_toy_detector


def _config(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "config", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_check_names_every_problem_with_section_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text(
        '[server]\ntcp_port = "x"\nbogus = 1\n[hardware]\nthreads = -1\nchoice = "best"\n'
        "[mqtt]\nport = true\n[typo]\n"
    )
    result = _config("check", str(bad))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    expected = [
        "unknown section(s) typo",
        "[server] unknown key(s) bogus",
        "[server] tcp_port: must be an integer",
        "[hardware] threads: must be 0",
        "[hardware] choice: must be one of",
        "[mqtt] port: must be an integer",
    ]
    for fragment in expected:
        assert any(fragment in line and line.startswith(str(bad)) for line in lines), fragment
    assert len(lines) == len(expected)
    assert "Traceback" not in result.stderr


def test_check_accepts_a_good_file_and_refuses_a_missing_one(tmp_path: Path) -> None:
    good = tmp_path / "agent.toml"
    good.write_text('[hardware]\nchoice = "fastest"\n')
    result = _config("check", str(good))
    assert (result.returncode, result.stdout.strip()) == (0, f"{good}: ok")
    missing = _config("check", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_check_loads_the_profiles_the_file_points_to(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "broken.toml").write_text("name = [\n")
    config = tmp_path / "agent.toml"
    config.write_text(f'[hardware]\nprofiles_dir = "{tmp_path / "profiles"}"\n')
    result = _config("check", str(config))
    assert result.returncode == 2
    assert result.stderr.startswith("[hardware] profiles_dir: ")
    assert "broken.toml: cannot read profile" in result.stderr


def test_show_lists_every_key_with_the_file_value_and_defaults(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[server]\ntcp_port = 9999\nmax_queue = 7\n")
    shown = _config("show", "--config", str(config), "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    for section, docs in describe_config().items():
        if section in TABLE_ARRAYS:  # [[peer]]: a list of tables, none in this file
            assert document[section] == []
            continue
        assert [row["key"] for row in document[section]] == [doc.key for doc in docs]
    server = {row["key"]: row for row in document["server"]}
    assert (server["tcp_port"]["value"], server["tcp_port"]["default"]) == (9999, 8080)
    assert server["max_queue"]["value"] == 7
    assert server["request_timeout_s"]["unit"] == "s"
    text = _config("show", "--defaults").stdout
    assert "[server]\n" in text and "tcp_port = 8080\n" in text
    assert "# [s] per-request deadline when the client sets none\n" in text


def test_check_refuses_a_deepstack_model_that_is_not_a_served_detector(tmp_path: Path) -> None:
    """Every DeepStack request would be refused "not activated": say so before the start."""
    models = tmp_path / "models"
    write_toy_detector(models / "toy")
    write_tiny_package(models / "tiny")
    config = tmp_path / "agent.toml"
    for model, problem in (
        ("nothing", "no model 'nothing' is served (packages: tiny, toy)"),
        ("tiny", "'tiny' is a classification model, not a detector"),
    ):
        config.write_text(
            f'[agent]\nmodels_dir = "{models}"\n[server]\ndeepstack_model = "{model}"\n'
        )
        result = _config("check", str(config))
        assert result.returncode == 2 and problem in result.stderr, result.stderr
    config.write_text(f'[agent]\nmodels_dir = "{models}"\n[server]\ndeepstack_model = "toy"\n')
    result = _config("check", str(config))
    assert result.returncode == 0, result.stderr


def test_show_never_prints_a_credential_read_from_a_file_or_the_config(tmp_path: Path) -> None:
    """Token files keep the tokens out of what is copied around; `config show` must not put
    them back in (text or --json): it says each is set, and shows every other key as before."""
    secrets = {"token": "tok-from-file-1", "admin": "adm-from-file-2", "password": "mqtt-pw-3"}
    (tmp_path / "token").write_text(secrets["token"] + "\n")
    (tmp_path / "admin").write_text(secrets["admin"] + "\n")
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[server]\ntoken_file = "{tmp_path / "token"}"\n'
        f'admin_token_file = "{tmp_path / "admin"}"\ntcp_port = 9099\n'
        f'[mqtt]\npassword = "{secrets["password"]}"\nusername = "dev1"\n'
    )
    text = _config("show", "--config", str(config))
    document = _config("show", "--config", str(config), "--json")
    assert text.returncode == 0 and document.returncode == 0, text.stderr + document.stderr
    for secret in secrets.values():
        assert secret not in text.stdout and secret not in document.stdout
    lines = text.stdout.splitlines()
    for key in ("token", "admin_token", "password"):
        assert f"# {key} =  (set; redacted)" in lines
    assert "tcp_port = 9099" in lines and 'username = "dev1"' in lines
    rows = {(s, r["key"]): r["value"] for s, rs in json.loads(document.stdout).items() for r in rs}
    assert rows["server", "token"] == rows["mqtt", "password"] == "<redacted>"
    assert rows["server", "tcp_port"] == 9099 and rows["mqtt", "username"] == "dev1"
    assert rows["server", "token_file"] == str(tmp_path / "token")  # where it is, not what


def test_show_prints_an_unset_credential_as_empty(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[server]\ntcp_port = 9099\n")
    result = _config("show", "--config", str(config))
    assert result.returncode == 0 and 'token = ""' in result.stdout.splitlines()


def test_show_lists_each_peer_table_and_hides_its_token(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[[peer]]\nurl = "https://10.0.0.2:8443"\ntoken = "peer-secret-1"\nmodels = ["tiny"]\n'
        '[[peer]]\nurl = "http://127.0.0.1:8081"\nname = "bench"\n'
    )
    assert _config("check", str(config)).returncode == 0
    document = json.loads(_config("show", "--config", str(config), "--json").stdout)
    peers = [{row["key"]: row["value"] for row in table} for table in document["peer"]]
    assert [(p["url"], p["name"], p["models"]) for p in peers] == [
        ("https://10.0.0.2:8443", "", ["tiny"]),
        ("http://127.0.0.1:8081", "bench", []),
    ]
    text = _config("show", "--config", str(config)).stdout
    assert text.count("[[peer]]\n") == 2 and "peer-secret-1" not in text
    assert "peer-secret-1" not in json.dumps(document)
    copied = tmp_path / "shown.toml"  # what show prints is a config that checks clean
    copied.write_text(text)
    assert _config("check", str(copied)).returncode == 0
    defaults = _config("show", "--defaults").stdout
    assert "# [[peer]]\n" in defaults and "\n[[peer]]" not in defaults
