"""`edgeagent profile` on one board, checked: the expected profile, and both zoo models served.

    profile_check.py emulated|pi5|rk3588 [--out FILE]

``emulated`` reads the live tree (the arm64 root under qemu: the kernel's /proc/cpuinfo is the
x86_64 host's, so the answer must come from the interpreter's machine); ``pi5`` and ``rk3588``
read the repository's fixture trees of those boards. Every candidate of the profile is probed
with a real load and inference of the digits classifier and the shapes detector. A CPU
candidate must work on arm64; an accelerator candidate (Edge TPU, NPU …) may fail here for lack
of the device, and is listed. Run with the interpreter of the venv the agent is installed in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from known import known

REPO = Path(__file__).resolve().parents[2]
BOARDS = {
    "emulated": (Path("/"), "generic-aarch64"),
    "pi5": (REPO / "tests/fixtures/boards/raspberry-pi-5", "raspberry-pi-5"),
    "rk3588": (REPO / "tests/fixtures/boards/rk3588", "rk3588"),
}
MODELS = ("digits_mnv3", "shapes_grid_mnv2")
CPU_DEVICES = ("CPU", "CPUExecutionProvider")


def problems(doc: dict, expected: str) -> tuple[list[str], list[str], list[str]]:
    """What is wrong with the profile's answer, the accelerators that could not run here, and
    the known runtime failures (scripts/arm64/known.py)."""
    wrong, absent, expected_failures = [], [], []
    if doc["profile"] != expected:
        wrong.append(f"profile {doc['profile']} ({doc['reason']}), expected {expected}")
    if doc["board"]["arch"] != "aarch64":
        wrong.append(f"arch {doc['board']['arch']}, expected aarch64")
    served = {m["model"]: m for m in doc["models"]}
    for name in MODELS:
        model = served.get(name)
        if model is None or not model.get("chosen"):
            wrong.append(f"{name}: no working candidate")
            continue
        for row in model["candidates"]:
            probe = row.get("probe") or {}
            if probe.get("ok", True):
                continue
            runtime, device, precision = row["candidate"].split(":")
            error = probe.get("error", "")
            line = f"{name} {row['candidate']}: {error[:160]}"
            why = known(f"{runtime}:{precision}", name, error)
            if device not in CPU_DEVICES:
                absent.append(line)
            elif why:
                expected_failures.append(f"{line} ({why})")
            else:
                wrong.append(line)
    return wrong, absent, expected_failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("board", choices=sorted(BOARDS))
    parser.add_argument("--out", type=Path, help="keep the profile's JSON here")
    args = parser.parse_args()
    root, expected = BOARDS[args.board]
    agent = Path(sys.executable).parent / "edgeagent"
    with tempfile.TemporaryDirectory(prefix="arm64-profile-") as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        for name in MODELS:
            (models / name).symlink_to(REPO / "zoo" / name)
        command = [str(agent), "profile", "--json", "--root", str(root), "--models-dir"]
        command += [str(models), "--state-dir", str(Path(tmp) / "state"), "--seconds", "0.05"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    sys.stderr.write(done.stderr)
    if not done.stdout.strip():
        print(f"summary: edgeagent profile exited {done.returncode} without a report")
        return 1
    doc = json.loads(done.stdout)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    wrong, absent, expected_failures = problems(doc, expected)
    for line in doc["board"]["notes"]:
        print(f"note: {line}")
    for line in absent:
        print(f"accelerator not present here: {line}")
    for line in expected_failures:
        print(f"KNOWN: {line}")
    for line in wrong:
        print(f"WRONG: {line}")
    chosen = ", ".join(f"{m['model']} → {m['chosen']}" for m in doc["models"])
    print(
        f"summary: {doc['profile']} ({doc['board']['arch']}); {chosen}; "
        f"{len(absent)} accelerator candidates absent"
        + (f"; {len(expected_failures)} KNOWN" if expected_failures else "")
        + (f"; {len(wrong)} WRONG" if wrong else "")
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
