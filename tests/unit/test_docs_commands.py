"""Every ``edgeagent …`` command line in the README's and the docs' shell blocks parses.

A reader copies these lines: a flag renamed or made required in the code must fail here, not on
their terminal. Each command goes through the CLI's own parser (``build_parser``), so a missing
required option, an unknown flag or a bad choice is caught without running anything. A line with
``…`` is an abbreviation on purpose and is left out.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeagent.api.settings import ServerSettings
from edgeagent.cli import build_parser
from edgeagent.commands.config import check
from tests.support.helpers import REPO

FENCE = re.compile(r"^```(?:sh|bash|shell|console)[ \t]*\n(.*?)^```", re.M | re.S)
PROGRAM = re.compile(r"(?:\S*/)?edgeagent")
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")  # "$(edgeagent status --socket-path)"
OPERATORS = set(";&|()")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def shell_lines(text: str) -> Iterator[str]:
    """The lines of every shell block, backslash continuations joined."""
    for block in FENCE.finditer(text):
        yield from re.sub(r"\\\n[ \t]*", " ", block.group(1)).splitlines()


def simple_commands(line: str) -> Iterator[list[str]]:
    """Each simple command of ``line`` (split at ; && || | and parentheses), comments dropped,
    and the commands inside ``$( … )``, with leading ``VAR=value`` and ``sudo`` removed."""
    for inner in SUBSTITUTION.findall(line):
        yield from simple_commands(inner)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    command: list[str] = []
    for token in [*lexer, ";"]:
        if set(token) <= OPERATORS:
            while command and (command[0] == "sudo" or re.match(r"\w+=", command[0])):
                command.pop(0)
            if command:
                yield command
            command = []
        else:
            command.append(token)


def documented_commands(program: re.Pattern[str] = PROGRAM) -> list[tuple[str, list[str]]]:
    """(page, arguments) of every command of ``program`` in the pages' shell blocks."""
    found = []
    for page in PAGES:
        for line in shell_lines(page.read_text(encoding="utf-8")):
            if "…" in line:
                continue
            for command in simple_commands(line):
                if program.fullmatch(command[0]):
                    found.append((str(page.relative_to(REPO)), command[1:]))
    return found


def parse_error(argv: list[str]) -> str | None:
    """argparse's complaint about ``argv``, or None when the CLI accepts it."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            build_parser(argv).parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            return errors.getvalue().strip().splitlines()[-1]
    return None


COMMANDS = documented_commands()


def test_the_pages_show_many_commands() -> None:
    """The extraction finds the pages' commands (an empty list would pass everything)."""
    pages = {page for page, _ in COMMANDS}
    assert len(COMMANDS) > 50 and {"README.md", "docs/fleet/quick-start.md"} <= pages
    assert ["status", "--socket-path"] in [argv for _, argv in COMMANDS]  # from inside $( )


@pytest.mark.parametrize(
    ("page", "argv"), COMMANDS, ids=[f"{page}:{' '.join(a)[:60]}" for page, a in COMMANDS]
)
def test_a_documented_command_parses(page: str, argv: list[str]) -> None:
    assert parse_error(argv) is None, f"{page}: edgeagent {shlex.join(argv)}: {parse_error(argv)}"


def test_a_command_missing_a_required_option_is_caught() -> None:
    text = "```sh\nsudo edgeagent package model.onnx --name m  # no --out\n```\n"
    ((argv),) = [c[1:] for line in shell_lines(text) for c in simple_commands(line)]
    assert "--out" in (parse_error(argv) or "")


def test_the_quick_start_device_config_passes_config_check(tmp_path: Path) -> None:
    """The device's ``agent.toml`` of the fleet quick start, as ``config check`` sees it."""
    text = (REPO / "docs/fleet/quick-start.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"^```toml\n(.*?)^```", text, re.M | re.S)
    assert "[updates]" in block and "enabled = true" in block
    config = tmp_path / "agent.toml"
    config.write_text(block, encoding="utf-8")
    assert check(config) == []
    config.write_text(block.replace("[mqtt]", "[mqtt]\nhots = 1"), encoding="utf-8")
    assert check(config)  # the check can fail: a misspelt key is a problem


def test_every_documented_body_to_the_hub_api_says_it_is_json() -> None:
    """The hub server answers 415 to a body without ``Content-Type: application/json``, and
    curl sends ``application/x-www-form-urlencoded`` unless told."""
    bodies = ("-d", "--data", "--data-binary", "--data-raw")
    calls = [
        (page, argv)
        for page, argv in documented_commands(re.compile("curl"))
        if any("/api/v1/" in a for a in argv) and any(a in bodies for a in argv)
    ]
    assert calls, "no documented curl sends a body to the hub API"
    for page, argv in calls:
        headers = [argv[i + 1].lower() for i, a in enumerate(argv[:-1]) if a in ("-H", "--header")]
        assert "content-type: application/json" in headers, f"{page}: curl {shlex.join(argv)}"


def test_the_camera_integrations_point_at_the_agents_default_port() -> None:
    """Frigate, Home Assistant and CodeProject.AI clients copied from the DeepStack page reach
    the agent only on the port it listens on by default."""
    text = (REPO / "docs/api/deepstack.md").read_text(encoding="utf-8")
    ports = re.findall(r"(?:https?://[\w.-]+:|\bport: )(\d+)", text)
    assert len(ports) >= 3, ports
    assert set(ports) == {str(ServerSettings().tcp_port)}


def test_the_troubleshooting_page_quotes_the_units_restart_policy() -> None:
    unit = (REPO / "systemd/edgeagent.service").read_text(encoding="utf-8")
    page = (REPO / "docs/operations/troubleshooting.md").read_text(encoding="utf-8")
    values = {}
    for key in ("Restart", "RestartSec", "RestartPreventExitStatus"):
        (values[key],) = re.findall(rf"^{key}=(\S+)$", unit, re.M)
        quoted = re.findall(rf"`{key}=([^`]+)`", page)
        assert set(quoted) <= {values[key]}, f"{key}: the unit has {values[key]}, page {quoted}"
    assert f"`Restart={values['Restart']}`" in page
    assert f"{values['RestartSec']} s after it exits" in page  # RestartSec, in words
