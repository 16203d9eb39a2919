"""The documentation site builds strictly, and the README stays a front page that links into it.

A newcomer finds their way by links: a page that links to nothing, a page nobody can reach from
the navigation, or a README that grows back into the manual are the failures guarded here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import markdown
import pytest
import yaml

from tests.support.helpers import REPO

README = REPO / "README.md"
README_MAX_LINES = 200
TRAINED_MODELS = {"digits_mnv3", "shapes_grid_mnv2"}


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` into ``site``: outside the tree, so a build never touches a
    tracked file (the site directory is the only thing mkdocs writes)."""
    command = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    return subprocess.run(
        [*command, "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner is not a warning
    )


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    result = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    reference = (tmp_path / "site/configuration/reference/index.html").read_text(encoding="utf-8")
    assert "max_body_bytes" in reference  # the generated reference is part of the site


@pytest.fixture
def docs_copy(tmp_path: Path) -> Path:
    """The site's sources copied aside, so a test can break them without touching the tree."""
    copy = tmp_path / "src"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    return copy


def _link_to_a_missing_page(src: Path) -> None:
    with (src / "docs/index.md").open("a", encoding="utf-8") as page:
        page.write("\n[gone](no-such-page.md)\n")


def _link_to_a_missing_anchor(src: Path) -> None:
    with (src / "docs/index.md").open("a", encoding="utf-8") as page:
        page.write("\n[gone](benchmarks.md#no-such-section)\n")


def _page_left_out_of_the_nav(src: Path) -> None:
    (src / "docs/no-such-page.md").write_text("# Nobody links here\n", encoding="utf-8")


def _nav_entry_without_its_page(src: Path) -> None:
    config = src / "mkdocs.yml"
    text = config.read_text(encoding="utf-8")
    entry = "  - Changelog: changelog.md\n"
    assert entry in text
    config.write_text(text.replace(entry, entry + "  - Gone: no-such-page.md\n"), "utf-8")


@pytest.mark.parametrize(
    "breakage",
    [
        _link_to_a_missing_page,
        _link_to_a_missing_anchor,
        _page_left_out_of_the_nav,
        _nav_entry_without_its_page,
    ],
)
def test_a_broken_site_fails_the_build(
    docs_copy: Path, tmp_path: Path, breakage: Callable[[Path], None]
) -> None:
    breakage(docs_copy)
    result = build(docs_copy / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "no-such-page.md" in output or "no-such-section" in output, output


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# edgeagent"  # the installed copy is checked by this title too
    assert len(lines) <= README_MAX_LINES, "move the detail into docs/ and link to it"


class _Links(HTMLParser):
    """Every link and image target of a rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is not None and (tag, name) in {("a", "href"), ("img", "src")}:
                self.targets.append(value)


def test_every_relative_link_in_the_readme_points_at_a_file() -> None:
    links = _Links()
    links.feed(markdown.markdown(README.read_text(encoding="utf-8"), extensions=["tables"]))
    relative = [
        urlsplit(target)
        for target in links.targets
        if not urlsplit(target).scheme and not target.startswith("#")
    ]
    assert any(link.path == "docs/index.md" for link in relative)
    missing = [link.path for link in relative if not (REPO / unquote(link.path)).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_readme_starts_with_a_trained_model() -> None:
    text = README.read_text(encoding="utf-8")
    first = re.search(r"edgeagent infer (\S+)", text)
    assert first, "the README shows no first request"
    assert first.group(1) in TRAINED_MODELS
    assert "untrained" in text[: first.start()], "say that the ImageNet models are untrained"


def _prose(text: str) -> set[str]:
    """The lines of a page long enough to be a sentence, whitespace squeezed."""
    lines = (" ".join(line.split()) for line in text.splitlines())
    return {line for line in lines if len(line) >= 30 and not line.startswith("|---")}


def _nav_pages(entries: object) -> list[str]:
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in _nav_pages(value)]
    if isinstance(entries, list):
        return [page for entry in entries for page in _nav_pages(entry)]
    return []


def test_the_site_landing_page_links_everything_and_copies_nothing_from_the_readme() -> None:
    """docs/index.md is the site's map, the README the project's front page: each thing once
    (a copied paragraph drifts), and every page of the navigation reachable from the map."""
    index = (REPO / "docs/index.md").read_text(encoding="utf-8")
    copied = _prose(index) & _prose(README.read_text(encoding="utf-8"))
    assert not copied, f"say it once, in README.md or docs/index.md, and link: {copied}"
    links = _Links()
    links.feed(markdown.markdown(index, extensions=["tables"]))
    linked = {urlsplit(target).path for target in links.targets}
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    missing = [page for page in _nav_pages(nav) if page != "index.md" and page not in linked]
    assert not missing, f"docs/index.md does not link to {missing}"
