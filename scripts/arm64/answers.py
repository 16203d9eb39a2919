"""Serve the zoo's digits classifier and shapes detector with one runtime × precision at a time
and record what the agent answers over its Unix socket, so two machines' answers can be compared.

scripts/test-arm64.sh runs this once on the x86_64 host and once inside the emulated arm64 root
(with the wheel installed there), then scripts/arm64/compare.py checks the two files agree. Each
run is the real daemon (``python -m edgeagent.cli run``) with a one-candidate device profile, so
the answer can only come from that runtime and precision; the images are real files a client
sends (the zoo's digit samples, held-out digits written back to PNG, held-out shape scenes).

    answers.py --zoo DIR --out FILE [--runs onnxruntime:fp32,litert:int8,...] [--timeout S]

No timings are recorded: under emulation they mean nothing about a board.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # devtools; edgeagent itself comes from the installed wheel first

from devtools.agent_process import spawn_agent  # noqa: E402
from devtools.detection_scenes import load_heldout  # noqa: E402
from devtools.waiting import wait_until  # noqa: E402
from edgeagent.api.client import AgentClient, AgentError  # noqa: E402
from edgeagent.runtimes import installed_version  # noqa: E402
from edgeagent.runtimes.base import RuntimeUnavailable  # noqa: E402

CLASSIFIER, DETECTOR = "digits_mnv3", "shapes_grid_mnv2"
RUNTIMES = ("onnxruntime", "litert", "openvino")
DEVICES = {"onnxruntime": "CPUExecutionProvider", "litert": "CPU", "openvino": "CPU"}
ALL_RUNS = [f"{r}:{p}" for r in RUNTIMES for p in ("fp32", "int8")]


def digit_images(zoo: Path, heldout: int) -> dict[str, bytes]:
    """The zoo's digit samples, and held-out digits turned back from tensors into PNG files."""
    images = {p.name: p.read_bytes() for p in sorted((zoo / "samples").glob("digit_*"))}
    with np.load(zoo / CLASSIFIER / "heldout.npz") as stored:
        inputs, labels = stored["inputs"][:heldout], stored["labels"][:heldout]
    for i, (tensor, label) in enumerate(zip(inputs, labels, strict=True)):
        pixels = np.clip((tensor[0] * 0.5 + 0.5) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
        images[f"heldout_{i:02d}_label{label}.png"] = buffer.getvalue()
    return images


def scene_images(zoo: Path, count: int) -> dict[str, bytes]:
    held = load_heldout(zoo / DETECTOR, limit=count)
    return {f"scene_{i:02d}.png": held.png(i) for i in range(len(held.images))}


def write_setup(work: Path, zoo: Path, run: str) -> Path:
    """A models directory with the two packages, a one-candidate profile and the agent.toml."""
    runtime, precision = run.split(":")
    models = work / "models"
    models.mkdir()
    for name in (CLASSIFIER, DETECTOR):
        (models / name).symlink_to((zoo / name).resolve())
    profiles = work / "profiles"
    profiles.mkdir()
    (profiles / "arm64-check.toml").write_text(
        'name = "arm64-check"\n'
        f'description = "only {run}, to compare answers across machines"\n'
        'arch = "any"\ngeneric = true\npriority = 0\n\n'
        f'[[candidate]]\nruntime = "{runtime}"\ndevice = "{DEVICES[runtime]}"\n'
        f'precision = "{precision}"\n'
    )
    config = work / "agent.toml"
    config.write_text(
        f"[agent]\nstate_dir = '{work / 'state'}'\nmodels_dir = '{models}'\n"
        f"[server]\nunix_socket = '{work / 'agent.sock'}'\ntcp_port = 0\n"
        f"[hardware]\nprofile = 'arm64-check'\nprofiles_dir = '{profiles}'\n"
        "[governor]\nenabled = false\n"
    )
    return config


def models_settled(client: AgentClient, process: subprocess.Popen[bytes]) -> bool:
    """True once neither model is still loading; raises if the daemon died meanwhile."""
    if process.poll() is not None:
        raise RuntimeError(f"the daemon exited with status {process.returncode}")
    try:
        states = {m["name"]: m.get("state", "") for m in client.models()}
    except AgentError:
        return False  # not listening yet
    return all(
        states.get(n) not in (None, "", "LOADING", "loading") for n in (CLASSIFIER, DETECTOR)
    )


def serve_and_ask(zoo: Path, run: str, images: dict[str, dict[str, bytes]], timeout: float) -> dict:
    """One daemon serving ``run``: the models' states and every answer (or its error)."""
    with tempfile.TemporaryDirectory(prefix="arm64-answers-") as tmp:
        work = Path(tmp)
        config = write_setup(work, zoo, run)
        log = work / "daemon.log"
        env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
        env.pop("NOTIFY_SOCKET", None)
        with log.open("wb") as out:
            process = spawn_agent(
                ["--config", str(config)], env=env, cwd=work, stdout=out, stderr=out
            )
        client = AgentClient(socket_path=work / "agent.sock", timeout=timeout)
        result: dict[str, Any] = {}
        try:
            wait_until(lambda: models_settled(client, process), timeout)
            result["models"] = {m["name"]: m for m in client.models()}
            result["classify"] = {
                name: ask(lambda b=body: client.classify(CLASSIFIER, b, top_k=3))
                for name, body in images["classify"].items()
            }
            path = f"/v1/models/{DETECTOR}/detect"
            result["detect"] = {
                name: ask(lambda b=body: json.loads(client.request("POST", path, b)[1]))
                for name, body in images["detect"].items()
            }
        except (AssertionError, RuntimeError) as exc:
            result["error"] = f"{exc}; daemon log: {log.read_text(errors='replace')[-2000:]}"
        finally:
            stop(process)
        return result


def ask(call: Any) -> Any:
    """The answer without its latency (emulated timings say nothing), or the error."""
    try:
        answer = call()
    except AgentError as exc:
        return {"error": f"{exc.status}: {exc}"}
    answer.pop("latency_ms", None)
    return answer


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def runtime_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in RUNTIMES:
        try:
            versions[name] = installed_version(name)
        except RuntimeUnavailable:
            versions[name] = None
    return versions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=REPO / "zoo")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", default=",".join(ALL_RUNS), help="runtime:precision list")
    parser.add_argument("--digits", type=int, default=12, help="held-out digits sent")
    parser.add_argument("--scenes", type=int, default=8, help="held-out scenes sent")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on each wait, s")
    args = parser.parse_args()
    versions = runtime_versions()
    images = {
        "classify": digit_images(args.zoo, args.digits),
        "detect": scene_images(args.zoo, args.scenes),
    }
    doc: dict[str, Any] = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "runtimes": versions,
        "runs": {},
    }
    for run in args.runs.split(","):
        runtime = run.split(":")[0]
        if versions.get(runtime) is None:
            doc["runs"][run] = {"skipped": f"{runtime} is not installed here"}
            print(f"{run}: skipped ({runtime} is not installed)", flush=True)
            continue
        doc["runs"][run] = serve_and_ask(args.zoo, run, images, args.timeout)
        print(f"{run}: {'error' if 'error' in doc['runs'][run] else 'answered'}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True))
    answered = [run for run, result in doc["runs"].items() if "models" in result]
    print(
        f"summary: {platform.machine()}: {len(answered)} of {len(doc['runs'])} runs served "
        f"({', '.join(answered)}); {sum(map(len, images.values()))} images each"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
