"""``scripts/coco_detector.sh`` says what each step does and attempts no variant the agent cannot
convert: its converters stand in here (the TensorFlow step and the packager record their
arguments), so the steps run in seconds; the real build is scripts/setup.sh's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO

SOURCES = REPO / "third-party-models"

AGENT = """#!/bin/sh
# The agent's Python: the packager records its arguments and makes the package directory;
# everything else (fetch_models.py, the import checks) is the real interpreter's.
if [ "$1 $2 $3" = "-m edgeagent.cli package" ]; then
  printf '%s\\n' "$@" > "$RECORD"
  while [ "$#" -gt 0 ]; do [ "$1" = --out ] && mkdir -p "$2"; shift; done
  exit 0
fi
exec {python} "$@"
"""
TF = """#!/bin/sh
# The TensorFlow converter: scripts/coco_ssd_graph.py SOURCE OUT.pb
: > "$3"
"""


def _run(tmp_path: Path, hide_openvino: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    hidden = tmp_path / "hide"
    (hidden / "openvino").mkdir(parents=True, exist_ok=True)
    (hidden / "openvino" / "__init__.py").write_text("raise ImportError('no openvino')\n")
    agent, tf = tmp_path / "agent", tmp_path / "tf"
    agent.write_text(AGENT.format(python=sys.executable))
    tf.write_text(TF)
    agent.chmod(0o755)
    tf.chmod(0o755)
    record = tmp_path / "package-args"
    path = [str(hidden)] if hide_openvino else []
    result = subprocess.run(
        ["bash", str(REPO / "scripts/coco_detector.sh"), "--out", str(tmp_path / "coco"),
         "--agent", str(agent), "--tf", str(tf)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "RECORD": str(record),
             "PYTHONPATH": os.pathsep.join([*path, str(REPO)])},
    )  # fmt: skip
    return result, record.read_text().splitlines() if record.exists() else []


@pytest.fixture(autouse=True)
def _sources() -> None:
    if not (SOURCES / "coco_ssd_tfjs" / "model.json").is_file():
        pytest.skip("third-party-models/ not fetched (scripts/setup.sh does)")


def test_each_step_is_announced_and_the_package_swapped_in(tmp_path: Path) -> None:
    result, arguments = _run(tmp_path, hide_openvino=False)
    assert result.returncode == 0, result.stderr
    steps = [line for line in result.stderr.splitlines() if line.startswith("coco_detector: ")]
    assert [s.split()[1] for s in steps[:4]] == ["1/4", "2/4", "3/4", "4/4"], steps
    assert steps[-1] == f"coco_detector: packaged {tmp_path / 'coco'}"
    assert "--variants" not in arguments  # every runtime there: the packager's default
    assert (tmp_path / "coco" / "LICENSE").is_file()


def test_without_openvino_no_openvino_variant_is_attempted(tmp_path: Path) -> None:
    result, arguments = _run(tmp_path, hide_openvino=True)
    assert result.returncode == 0, result.stderr
    assert "no OpenVINO in" in result.stderr and "edgeagent[openvino]" in result.stderr
    chosen = arguments[arguments.index("--variants") + 1].split(",")
    assert "int8" in chosen and not any(v.startswith("openvino") for v in chosen)
