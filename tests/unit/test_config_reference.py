"""Every config key is documented once, in code, and the docs' reference page is that text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from edgeagent.commands.config import check, render_markdown
from edgeagent.config import SECTIONS, TABLE_ARRAYS, describe_config
from edgeagent.paths import shipped
from edgeagent.sections import describe_section, setting
from tests.support.helpers import REPO

REFERENCE = re.compile(
    r"<!-- BEGIN config reference -->\n(.*)<!-- END config reference -->", re.DOTALL
)


REFERENCE_PAGE = REPO / "docs" / "configuration" / "reference.md"


def test_the_docs_reference_is_generated_from_the_settings_classes() -> None:
    found = REFERENCE.search(REFERENCE_PAGE.read_text(encoding="utf-8"))
    assert found, f"{REFERENCE_PAGE.relative_to(REPO)} lacks the config reference markers"
    assert found.group(1) == render_markdown(), (
        f"{REFERENCE_PAGE.relative_to(REPO)} is stale: regenerate the part between its markers "
        "with `edgeagent config show --markdown`"
    )


def test_every_key_of_every_section_has_a_description() -> None:
    described = describe_config()
    assert set(described) == set(SECTIONS) | set(TABLE_ARRAYS)
    for section, docs in described.items():
        assert docs, section
        for doc in docs:
            assert doc.description.strip(), f"[{section}] {doc.key}"
            assert "\n" not in doc.description, f"[{section}] {doc.key}: one line"
    server = {doc.key for doc in described["server"]}
    assert {"tcp_port", "max_queue"} <= server  # listener and engine halves of one table


def test_units_follow_the_key_suffix() -> None:
    suffixes = {
        "_s": "s",
        "_ms": "ms",
        "_c": "°C",
        "_bytes": "bytes",
        "_percent": "%",
        "_bytes_per_s": "bytes/s",
    }
    for section, docs in describe_config().items():
        for doc in docs:
            matching = [suffix for suffix in suffixes if doc.key.endswith(suffix)]
            if matching:  # the longest suffix names the unit: _bytes_per_s, not _s
                unit = suffixes[max(matching, key=len)]
                assert doc.unit == unit, f"[{section}] {doc.key}: unit {doc.unit!r}"


def test_a_key_declared_without_a_description_is_refused() -> None:
    @dataclass(frozen=True)
    class Undocumented:
        documented: int = setting(1, "has one")
        bare: list[str] = field(default_factory=list)

    with pytest.raises(TypeError, match="Undocumented.bare"):
        describe_section(Undocumented)


def test_the_shipped_example_config_checks_clean() -> None:
    assert check(shipped("agent.example.toml")) == []
