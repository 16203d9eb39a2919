"""``edgeagent package`` without its optional ``onnx`` says which pip command installs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.helpers import REPO, write_tiny_package


def test_without_onnx_it_gives_the_pip_command(tmp_path: Path) -> None:
    hidden = tmp_path / "hide"  # first on the path: `import onnx` fails as if not installed
    (hidden / "onnx").mkdir(parents=True)
    (hidden / "onnx" / "__init__.py").write_text("raise ImportError('No module named onnx')\n")
    source = write_tiny_package(tmp_path / "tiny") / "tiny.fp32.onnx"
    result = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "package", str(source), "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{hidden}{os.pathsep}{REPO}"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "edgeagent package: needs onnx" in result.stderr
    assert "pip install 'edgeagent[package]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # refused before any work
