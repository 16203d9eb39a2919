"""The peers ``scripts/bench_serving.py --peers`` measures edgeagent against: installed,
started, waited for, probed and stopped.

- the naive server, ``scripts/bench_peers.py naive`` in its own process (kept apart so its RSS
  and CPU are its own, not this module's imports);
- MLServer (Seldon), installed by ``mlserver_venv`` into a bench-only ``.venv-mlserver`` with
  onnxruntime, serving the same ONNX file through a small custom runtime (MLServer ships none
  for ONNX) with its own v2 codecs and default settings.

A peer that fails to start stops the others; MLServer failing is a note, not the end of a run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from devtools.bench_daemon import stop_tree
from devtools.http_endpoint import Endpoint, http_client
from devtools.ports import free_port
from devtools.waiting import until
from edgeagent.api.v2 import HEADER_LENGTH, encode_request

REPO = Path(__file__).resolve().parents[1]
NAIVE_SERVER = REPO / "scripts" / "bench_peers.py"
MLSERVER_VENV = REPO / ".venv-mlserver"


# ---------------------------------------------------------------------------------------------
# MLServer

MLSERVER_RUNTIME = '''
"""An onnxruntime model for MLServer (it ships no ONNX runtime): its own v2 codecs."""
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        threads = int(self.settings.parameters.extra.get("threads", 0))
        if threads:
            options.intra_op_num_threads = threads
        self._session = ort.InferenceSession(
            self.settings.parameters.uri, options, providers=["CPUExecutionProvider"]
        )
        self._feed = self._session.get_inputs()[0].name
        self._names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        array = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        results = self._session.run(self._names, {self._feed: array})
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(n, r) for n, r in zip(self._names, results)],
        )
'''


# MLServer 1.7.1's inference workers call asyncio.get_event_loop() in a fresh process, which
# uvloop 0.22 and later refuse ("There is no current event loop"): every worker dies at start.
MLSERVER_REQUIREMENTS = ["mlserver", "onnxruntime", "uvloop<0.22"]


def mlserver_venv(log) -> Path | str:
    """``.venv-mlserver/bin/mlserver``, installing it on first use; or why it cannot be.

    A stamp naming the requirements marks a finished install, so an interrupted or older one
    is completed rather than used.
    """
    binary = MLSERVER_VENV / "bin" / "mlserver"
    stamp = MLSERVER_VENV / "bench-requirements.txt"
    wanted = "\n".join(MLSERVER_REQUIREMENTS) + "\n"
    if binary.exists() and stamp.is_file() and stamp.read_text() == wanted:
        return binary
    log(f"installing {', '.join(MLSERVER_REQUIREMENTS)} into {MLSERVER_VENV}")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(MLSERVER_VENV)], check=True)
        subprocess.run(
            [
                str(MLSERVER_VENV / "bin" / "pip"),
                "install",
                "-q",
                "--disable-pip-version-check",
                *MLSERVER_REQUIREMENTS,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as exc:
        return f"MLServer could not be installed: {(exc.stderr or str(exc)).strip()[-500:]}"
    stamp.write_text(wanted)
    return binary


def start_mlserver(
    binary: Path, work: Path, model: Path, name: str, threads: int, port: int, grpc_port: int
) -> subprocess.Popen:
    """MLServer with its default settings on ``port`` serving ``model`` as ``name``."""
    folder = work / "mlserver"
    (folder / name).mkdir(parents=True)
    (folder / name / "runtime.py").write_text(MLSERVER_RUNTIME)
    (folder / name / "model-settings.json").write_text(
        json.dumps(
            {
                "name": name,
                "implementation": "runtime.OnnxModel",
                "parameters": {"uri": str(model), "extra": {"threads": threads}},
            }
        )
    )
    (folder / "settings.json").write_text(
        json.dumps({"http_port": port, "grpc_port": grpc_port, "metrics_port": 0, "debug": False})
    )
    env = {**os.environ, "PYTHONPATH": str(folder / name)}
    return subprocess.Popen(
        [str(binary), "start", str(folder)],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---------------------------------------------------------------------------------------------
# A run's peers


@dataclass
class Peers:
    """The peer servers of one --peers run (each None when it could not start) and why not."""

    naive: subprocess.Popen | None = None
    naive_sock: Path | None = None
    naive_port: int = 0
    naive_ready_s: float = float("nan")  # start → ready (model loaded, listening)
    mlserver: subprocess.Popen | None = None
    mlserver_port: int = 0
    notes: list[str] | None = None

    def processes(self) -> list[subprocess.Popen]:
        return [p for p in (self.naive, self.mlserver) if p is not None]


async def start_peers(
    args, model_file: Path, package, work: Path, frame: np.ndarray, progress: Callable[[str], None]
) -> Peers:
    """Start the naive server and MLServer; a peer that fails to start stops the others."""
    peers = Peers(notes=[])
    try:
        await _start_peers(peers, args, model_file, package, work, frame, progress)
    except BaseException:
        for each in peers.processes():
            stop_tree(each)
        raise
    return peers


async def _start_peers(
    peers: Peers,
    args,
    model_file: Path,
    package,
    work: Path,
    frame,
    progress: Callable[[str], None],
) -> None:
    name = package.name
    peers.naive_sock = work / "naive.sock"
    peers.naive_port = free_port()
    command = [sys.executable, str(NAIVE_SERVER), "naive", "--model", str(model_file)]
    command += ["--name", name, "--threads", str(args.threads), "--socket", str(peers.naive_sock)]
    command += ["--port", str(peers.naive_port)]
    started = time.perf_counter()
    peers.naive = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    await wait_http(peers.naive_sock, "/v2/health/ready", peers.naive, "the naive server")
    peers.naive_ready_s = time.perf_counter() - started
    if args.skip_mlserver:
        peers.notes.append("MLServer skipped (--skip-mlserver)")
        return
    binary = mlserver_venv(progress)
    if isinstance(binary, str):
        peers.notes.append(binary)
        progress(binary)
        return
    peers.mlserver_port = free_port()
    peers.mlserver = start_mlserver(
        binary, work, model_file, name, args.threads, peers.mlserver_port, free_port()
    )
    try:
        await wait_http(peers.mlserver_port, f"/v2/models/{name}/ready", peers.mlserver, "MLServer")
    except SystemExit as exc:  # the other servers are still worth measuring
        peers.notes.append(f"MLServer left out: {str(exc)[-300:]}")
        progress(peers.notes[-1])
        stop_tree(peers.mlserver)
        peers.mlserver = None


async def wait_http(endpoint: Endpoint, path: str, process: subprocess.Popen, what: str) -> None:
    """Poll ``path`` until it answers 200 (peers start in seconds; MLServer in ~10)."""

    async def answers() -> bool:
        if process.poll() is not None:
            stderr = process.stderr.read() if process.stderr else ""
            raise SystemExit(f"{what} exited with {process.returncode}: {stderr[-2000:]}")
        try:
            async with http_client(endpoint) as client, client.get(path) as response:
                return response.status == 200
        except (aiohttp.ClientError, OSError):
            return False

    try:
        await until(answers, 120, poll_s=0.02)  # fine enough to time start → ready
    except AssertionError:
        raise SystemExit(f"{what} did not become ready") from None


async def probe_binary(port: int, name: str, feeds: dict[str, np.ndarray]) -> str:
    """Whether MLServer answers the binary tensor extension; never benchmarked, since 1.7.1
    answers nothing to it and, from then on, nothing to JSON requests either."""
    body, length = encode_request(feeds, binary=True)
    headers = {HEADER_LENGTH: str(length)}
    try:
        async with (
            http_client(port) as client,
            client.post(
                f"/v2/models/{name}/infer",
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response,
        ):
            answer = f"HTTP {response.status}: {(await response.text())[:200]}"
    except (TimeoutError, aiohttp.ClientError) as exc:
        answer = f"no answer ({type(exc).__name__})"
    return f"MLServer, one v2 binary request (not benchmarked): {answer}"
