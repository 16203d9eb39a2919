#!/usr/bin/env python3
"""The peers that ``bench_serving.py --peers`` measures edgeagent against.

- ``naive``: the ~30-line server a user would write instead of running edgeagent: aiohttp,
  one onnxruntime session, ``session.run`` in the default executor, v2 JSON and binary, on a
  Unix socket and a TCP port. Run as ``python scripts/bench_peers.py naive ...``. Its
  ``/v2/models/{name}/floor`` route handles a request the same way but answers a canned result
  without running the model: the HTTP round trip alone, the floor under any served latency.
- MLServer (Seldon), installed by ``mlserver_venv`` into a bench-only ``.venv-mlserver`` with
  onnxruntime, serving the same ONNX file through a small custom runtime (MLServer ships none
  for ONNX) with its own v2 codecs and default settings.

Each peer runs in its own process, so the bench can count its CPU like the daemon's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MLSERVER_VENV = REPO / ".venv-mlserver"
HEADER_LENGTH = "Inference-Header-Content-Length"


# ---------------------------------------------------------------------------------------------
# The naive server


def serve_naive(model: Path, name: str, threads: int, sock: Path, port: int) -> None:
    import numpy as np
    import onnxruntime as ort
    from aiohttp import web

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0].name
    names = [o.name for o in session.get_outputs()]
    first = session.get_inputs()[0]
    zeros = np.zeros([d if isinstance(d, int) else 1 for d in first.shape], np.float32)
    canned = session.run(names, {feed: zeros})

    async def run_model(array):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, session.run, names, {feed: array})

    async def run_nothing(array):
        return canned

    async def infer(request: web.Request) -> web.Response:
        return await answer(request, run_model)

    async def floor(request: web.Request) -> web.Response:
        """The same request, decoded and answered, with no model run: what HTTP and the
        client cost on their own (the bench's "HTTP floor")."""
        return await answer(request, run_nothing)

    async def answer(request: web.Request, run) -> web.Response:
        body = await request.read()
        length = request.headers.get(HEADER_LENGTH)
        head = json.loads(body if length is None else body[: int(length)])
        tensor = head["inputs"][0]
        if length is None:
            array = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        else:
            array = np.frombuffer(body[int(length) :], np.float32).reshape(tensor["shape"])
        results = await run(array)
        outputs = [
            {"name": n, "datatype": "FP32", "shape": list(r.shape)}
            for n, r in zip(names, results, strict=True)
        ]
        if length is None:
            for entry, result in zip(outputs, results, strict=True):
                entry["data"] = result.ravel().tolist()
            return web.json_response({"model_name": name, "outputs": outputs})
        blobs = [r.tobytes() for r in results]
        for entry, blob in zip(outputs, blobs, strict=True):
            entry["parameters"] = {"binary_data_size": len(blob)}
        header = json.dumps({"model_name": name, "outputs": outputs}).encode()
        return web.Response(
            body=header + b"".join(blobs),
            headers={HEADER_LENGTH: str(len(header))},
            content_type="application/octet-stream",
        )

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def main() -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v2/models/{name}/infer", infer)
        app.router.add_post("/v2/models/{name}/floor", floor)
        app.router.add_get("/v2/health/ready", ready)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, str(sock)).start()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    naive = sub.add_parser("naive", help="run the naive server until killed")
    naive.add_argument("--model", type=Path, required=True)
    naive.add_argument("--name", required=True)
    naive.add_argument("--threads", type=int, default=0)
    naive.add_argument("--socket", type=Path, required=True)
    naive.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve_naive(args.model, args.name, args.threads, args.socket, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
