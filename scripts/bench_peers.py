#!/usr/bin/env python3
"""The naive peer that ``bench_serving.py --peers`` measures edgeagent against.

- ``naive``: the ~30-line server a user would write instead of running edgeagent: aiohttp,
  one onnxruntime session, ``session.run`` in the default executor, v2 JSON and binary, on a
  Unix socket and a TCP port. Run as ``python scripts/bench_peers.py naive ...``. Its
  ``/v2/models/{name}/floor`` route handles a request the same way but answers a canned result
  without running the model: the HTTP round trip alone, the floor under any served latency.
- MLServer, the other peer, is installed and started by ``devtools/serving_peers.py``, which
  starts this server too.

Each peer runs in its own process, so the bench can count its CPU like the daemon's; this file
imports nothing but the standard library at its top, so its RSS is the server's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

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
