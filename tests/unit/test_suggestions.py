"""Unknown names get a "did you mean": agent.toml sections and keys, model.toml fields in every
table, CLI sub-commands and options; and no location prefix is ever empty (``: :``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgeagent.cli import build_parser
from edgeagent.config import parse_config
from edgeagent.models.package import PackageError, load_package
from edgeagent.sections import ConfigError
from tests.support.helpers import REPO


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[agent]\nlog_levl = 'INFO'\n",
            "[agent] unknown key(s) log_levl (did you mean log_level?)",
        ),
        ("[servr]\n", "unknown section(s) servr (did you mean server?)"),
        # [server] is shared by the listener's and the engine's keys: both are candidates.
        ("[server]\ntcp_prot = 1\n", "[server] unknown key(s) tcp_prot (did you mean tcp_port?)"),
        ("[server]\nmax_batch = 1\n", "(did you mean max_batch_size?)"),
        ("[governor]\ninterval = 1\n", "[governor] unknown key(s) interval (did you mean "),
        ("[mqtt]\nhots = 'x'\n", "[mqtt] unknown key(s) hots (did you mean host?)"),
    ],
)
def test_an_unknown_config_name_suggests_the_close_one(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "agent.toml")
    assert expected in str(caught.value)


def test_no_suggestion_when_nothing_is_close() -> None:
    with pytest.raises(ConfigError, match="bogus; known keys") as caught:
        parse_config("[agent]\nbogus = 1\n", "agent.toml")
    assert "did you mean" not in str(caught.value)


def test_several_unknown_keys_each_get_their_match() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("[agent]\nlog_levl = 'INFO'\ndevice_di = 'x'\n", "agent.toml")
    assert "(did you mean device_id for device_di, log_level for log_levl?)" in str(caught.value)


def _edit(package: Path, old: str, new: str) -> Path:
    manifest = package / "model.toml"
    text = manifest.read_text()
    assert old in text, f"fixture no longer contains {old!r}"
    manifest.write_text(text.replace(old, new))
    return manifest


@pytest.mark.parametrize(
    ("old", "new", "where", "typo", "meant"),
    [
        (
            'task = "classification"',
            'task = "classification"\nlables = "x"',
            "",
            "lables",
            "labels",
        ),
        ("size = [8, 8]", "size = [8, 8]\ncolr = 'RGB'", "preprocess: ", "colr", "color"),
        ('layout = "NCHW"', 'layout = "NCHW"\ndtpye = 1', "inputs[0]: ", "dtpye", "dtype"),
        ("max_batch_size = 4", "max_batch_size = 4\ncache = 1", "serving: ", "cache", "cache_size"),
        ('precision = "fp32"', 'precision = "fp32"\nfile = 1', "variant[0]: ", "file", "files"),
    ],
)
def test_an_unknown_model_toml_field_suggests_the_close_one(
    tiny_package: Path, old: str, new: str, where: str, typo: str, meant: str
) -> None:
    manifest = _edit(tiny_package, old, new)
    with pytest.raises(PackageError) as caught:
        load_package(tiny_package)
    message = str(caught.value)
    assert message.startswith(f"{manifest}: {where}unknown field(s) {typo} (did you mean {meant}?)")
    assert ": :" not in message


def test_the_top_level_table_has_no_empty_location(tiny_package: Path) -> None:
    """The report's own example: ``model.toml: : unknown field(s) lables``."""
    manifest = _edit(tiny_package, 'name = "tiny"', 'name = "tiny"\nlables = 1')
    with pytest.raises(PackageError) as caught:
        load_package(tiny_package)
    assert str(caught.value).startswith(f"{manifest}: unknown field(s) lables")


def _parse_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser(argv).parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_sub_command_suggests_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    err = _parse_error(capsys, "stauts")
    assert "invalid choice: 'stauts' (did you mean 'status'?) (choose from 'infer'" in err


def test_a_nested_sub_command_suggests_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert "(did you mean 'check'?)" in _parse_error(capsys, "config", "chek")
    assert "(did you mean 'publish'?)" in _parse_error(capsys, "hub", "publsh")


def test_an_unknown_option_is_named_by_its_own_command(capsys: pytest.CaptureFixture[str]) -> None:
    err = _parse_error(capsys, "status", "--jsn", "--sockt=x")
    assert err.splitlines()[0].startswith("usage: edgeagent status")
    assert (
        "edgeagent status: error: unrecognized arguments: --jsn --sockt=x "
        "(did you mean --json for --jsn, --socket for --sockt?)"
    ) in err


def test_no_option_suggestion_when_nothing_is_close(capsys: pytest.CaptureFixture[str]) -> None:
    err = _parse_error(capsys, "status", "--zzzzzz")
    assert re.search(r"unrecognized arguments: --zzzzzz$", err.strip())


def test_the_installed_command_suggests() -> None:
    """Through the real entry point, as a user types it."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeagent.cli",
            "infer",
            "tiny",
            "x.png",
            "--runtme",
            "onnxruntime",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "(did you mean --runtime?)" in result.stderr
