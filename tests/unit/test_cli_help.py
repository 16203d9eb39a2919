"""Every option of every command says what it does and shows its default; no markup leaks."""

from __future__ import annotations

import argparse
import logging
import re

import pytest

from edgeagent.cli import COMMANDS, build_parser, log_format


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        found.append((path, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")

    walk(build_parser(), "edgeagent")
    for name in COMMANDS:  # the CLI builds a command's full parser only when it is named
        top = build_parser([name])
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                walk(action.choices[name], f"edgeagent {name}")
    return found


def test_every_option_has_help_and_shows_its_default() -> None:
    for path, parser in _parsers():
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.dest == "help":
                continue
            assert action.help, f"{path} {action.option_strings or action.dest}: no help text"
            if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
                shown = f"default: {action.default}" in text or (
                    "default" in action.help and str(action.default) in action.help
                )
                assert shown, f"{path} {action.option_strings}: default {action.default!r} hidden"


@pytest.mark.parametrize(
    ("command", "option", "default"),
    [
        ("edgeagent hub keygen", "--root-keys", "1"),
        ("edgeagent hub serve", "--port", "8000"),
        ("edgeagent hub serve", "--host", "0.0.0.0"),
        ("edgeagent hub status", "--broker", "127.0.0.1:1883"),
        ("edgeagent bench", "--seconds", "3.0"),
    ],
)
def test_the_defaults_the_issue_named_are_shown(command: str, option: str, default: str) -> None:
    text = dict(_parsers())[command].format_help()
    entry = re.search(rf"^ +{option}\b.*?(?=^ +-|\Z)", text, re.MULTILINE | re.DOTALL)
    assert entry and f"(default: {default})" in " ".join(entry.group(0).split()), text


def test_no_docstring_markup_reaches_the_help() -> None:
    for path, parser in _parsers():
        assert "``" not in parser.format_help(), path


def test_log_lines_carry_a_timestamp_unless_journald_stamps_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = logging.LogRecord("edgeagent.x", logging.WARNING, __file__, 1, "hello", None, None)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    stamped = logging.Formatter(log_format()).format(record)
    assert stamped.endswith("WARNING edgeagent.x: hello") and stamped[:4].isdigit()
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    assert logging.Formatter(log_format()).format(record) == "WARNING edgeagent.x: hello"
