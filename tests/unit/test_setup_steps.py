"""scripts/steps.sh: a set-up step is one line on the terminal, its output in a log file, and a
failing step still fails the script with its own exit status (setup.sh and test.sh use it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

STEPS = Path(__file__).resolve().parents[2] / "scripts" / "steps.sh"


def run_script(body: str, logs: Path) -> subprocess.CompletedProcess[str]:
    script = f"set -euo pipefail\nsource '{STEPS}'\n{body}\necho after >&2\n"
    return subprocess.run(
        ["bash", "-c", script],
        env={"PATH": "/usr/bin:/bin", "SETUP_LOGS": str(logs), "STEP_TAIL_LINES": "2"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_step_that_succeeds_is_one_line_and_its_output_is_in_the_log(tmp_path: Path) -> None:
    done = run_script("run_step 'runtime environment' venv printf 'pip noise\\n'", tmp_path)
    assert done.returncode == 0, done.stderr
    first, after = done.stderr.splitlines()
    assert first.startswith("==> runtime environment ... done in ") and first.endswith(" s")
    assert after == "after" and done.stdout == ""
    assert (tmp_path / "venv.log").read_text() == "pip noise\n"


def test_a_failing_step_shows_its_log_tail_and_path_and_fails_the_script(tmp_path: Path) -> None:
    body = """
    build() {
      echo one; echo two; echo three
      (exit 3)  # the step's first failing command ends it under set -e…
      echo "never reached"
    }
    run_step "model zoo" zoo build
    """
    done = run_script(body, tmp_path)
    assert done.returncode == 3  # …and its status is the script's
    lines = done.stderr.splitlines()
    assert lines[0].startswith("==> model zoo ... FAILED (exit 3) after ")
    assert lines[1:] == ["    two", "    three", f"    full log: {tmp_path / 'zoo.log'}"]
    assert "never reached" not in (tmp_path / "zoo.log").read_text()
