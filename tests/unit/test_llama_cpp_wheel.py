"""Set-up installs llama-cpp-python only from the wheel scripts/llama_cpp_wheel.sh compiled with
portable flags: pip, given the `llm` extra on its own, would compile it with -march=native (or
hand back such a build from its cache) and the agent would die with "Illegal instruction" on
another CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "llama_cpp_wheel.sh"


def test_the_llm_extra_pins_the_version_the_script_builds() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = [r for r in extras["llm"] if r.startswith("llama-cpp-python")]
    assert len(pins) == 1 and re.fullmatch(r"llama-cpp-python==\d+(\.\d+)+", pins[0]), pins
    # the script reads the version with this very expression
    line = next(x for x in SCRIPT.read_text().splitlines() if x.startswith("version=$("))
    found = subprocess.run(
        ["bash", "-c", line + '\necho "$version"'], cwd=ROOT, capture_output=True, text=True
    )
    assert found.stdout.strip() == pins[0].split("==")[1], found.stderr


def test_set_up_installs_the_llm_extras_only_through_the_keyed_wheel() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    installs = [x for x in setup.splitlines() if re.search(r"\.\[[^\]]*\bllm\b", x)]
    assert installs and all("scripts/llama_cpp_wheel.sh" in x for x in installs), installs
    script = SCRIPT.read_text()
    assert "--no-cache-dir" in script and "-DGGML_NATIVE=OFF" in script
    assert "--only-binary llama-cpp-python" in script


def test_without_a_venv_it_says_how_to_call_it() -> None:
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "usage: scripts/llama_cpp_wheel.sh VENV" in done.stderr
