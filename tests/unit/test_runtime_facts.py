"""Runtime names and file suffixes live in runtimes/facts.py only (issue 22 §5): the packager,
the package reader and the plugins ask it, so a new runtime or format is one table entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgeagent.models.package import PackageError, load_package
from edgeagent.runtimes.facts import RUNTIME_FACTS, native_runtime, weights_file
from tests.support.helpers import write_tiny_package

REPO = Path(__file__).resolve().parents[2]
SUFFIX = re.compile(r"[\"']\.(?:onnx|tflite|xml|bin)[\"']")
NAME = r"[\"'](?:onnxruntime|litert|openvino)[\"']"
NAMES = re.compile(rf"{NAME}\s*,\s*{NAME}")  # a list of names (a dispatch keyed by one is not)


@pytest.mark.parametrize(
    ("name", "runtime", "weights"),
    [
        ("m.onnx", "onnxruntime", None),
        ("M.TFLITE", "litert", None),
        ("m.fp32.xml", "openvino", "m.fp32.bin"),
        ("m.bin", None, None),
        ("m.pt", None, None),
    ],
)
def test_a_file_is_its_runtimes_by_suffix(name: str, runtime: str | None, weights: str | None):
    path = Path("/pkg") / name
    assert native_runtime(path) == runtime
    assert weights_file(path) == (path.with_name(weights) if weights else None)


def test_every_runtime_accepts_its_own_format_and_its_weights() -> None:
    order = list(RUNTIME_FACTS)
    for facts in RUNTIME_FACTS.values():
        owner = native_runtime(Path("m" + facts.native_suffix))
        # a format two runtimes read (an IR: openvino, openvino_genai) is the first one's
        assert owner == facts.name or (owner and order.index(owner) < order.index(facts.name))
        assert set(facts.suffixes) == {*facts.model_suffixes, *filter(None, [facts.weights])}


def test_an_ir_without_its_weights_is_refused_naming_both_files(tmp_path: Path) -> None:
    root = write_tiny_package(tmp_path / "tiny")
    (root / "tiny.xml").write_text("<net/>")
    with (root / "model.toml").open("a") as manifest:
        manifest.write('\n[[variant]]\nruntime = "openvino"\nprecision = "fp32"\n')
        manifest.write('files = ["tiny.xml"]\n')
    with pytest.raises(PackageError, match=r"'tiny.xml' needs its weights file \(tiny.bin\)"):
        load_package(root)


def test_no_module_but_the_facts_spells_a_table_of_suffixes_or_runtime_names() -> None:
    """A line with two or more suffix literals, or a list of runtime names, is a table."""
    tables = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in (REPO / "edgeagent").rglob("*.py")
        if path.name != "facts.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(SUFFIX.findall(line)) > 1 or NAMES.search(line)
    ]
    assert tables == []
