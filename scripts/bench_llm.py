#!/usr/bin/env python3
"""Language-model serving benchmark: the agent vs llama-cpp-python's own OpenAI server.

One run, one GGUF, the same threads and the same cores (``taskset``) on every side:

- **agent**: ``edgeagent run`` serving the package of the GGUF (the zoo's, or packaged here)
  over loopback TCP with its token, ``[llm]`` sized like the peer (context, threads);
- **peer**: ``python -m llama_cpp.server`` on the same file (requests serialised, as it does:
  ``--interrupt_requests False`` so a second stream waits instead of cutting the first);
- **in-process**: ``llama_cpp.Llama.create_completion`` in this process (the limit on these
  cores: no HTTP, no scheduler);
- **OpenVINO GenAI**: ``openvino_genai.LLMPipeline`` on the GGUF itself (its GGUF reader),
  one stream, beside llama.cpp in-process.

Rounds alternate the order of the sides, and every figure is the median over rounds:
one stream's decode tokens/s and time to first token (TTFT), and for the servers four
concurrent streams' aggregate tokens/s and each stream's inter-token p95; each server's RSS
with the model loaded (its process tree, after the warm-up). Ratios come from one run only:
this process is the client and shares the cores, so absolute figures move with the machine.

    .venv/bin/python scripts/bench_llm.py                  # SmolLM2 Q4_1, 2 threads, cores 0,1
    .venv/bin/python scripts/bench_llm.py --rounds 7 --json bench-out/llm.json
    .venv/bin/python scripts/bench_llm.py --gguf third-party-models/gemma-3-270m-q4_k_m.gguf \
        --skip agent                                       # a second architecture (--bench fetch)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from devtools.agent_process import spawn_agent  # noqa: E402
from devtools.bench_daemon import stop_tree  # noqa: E402
from devtools.http_endpoint import http_client  # noqa: E402
from devtools.ports import free_port  # noqa: E402
from devtools.waiting import until  # noqa: E402

GGUF = REPO / "third-party-models" / "smollm2-135m-instruct-q4_1.gguf"
ZOO_PACKAGE = REPO / "zoo" / "smollm2"
PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "The story begins on a stormy night, when"
)
SIDES = ("agent", "peer", "in-process", "openvino")
_serial = itertools.count(1)


def prompt() -> str:
    """The prompt with a number of its own in front: no request reuses another's cached
    prefix (the agent's prefix cache and llama.cpp's prompt reuse would measure a cache)."""
    return f"{next(_serial)}. {PROMPT}"


@dataclass
class Stream:
    """One streamed completion as its client saw it."""

    ttft_s: float
    tokens: int
    decode_s: float  # first chunk → last chunk
    gaps: list[float] = field(default_factory=list)  # between successive chunks

    @property
    def decode_tps(self) -> float:
        return (self.tokens - 1) / self.decode_s if self.decode_s > 0 and self.tokens > 1 else 0.0


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


# ---- the servers ---------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen
    model: str
    headers: dict[str, str]
    log: Path

    def rss_mb(self) -> float:
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
            return sum(p.memory_info().rss for p in tree) / 2**20
        except psutil.NoSuchProcess:
            return 0.0


def pinned(cores: str) -> list[str]:
    return ["taskset", "-c", cores] if cores else []


def start_peer(gguf: Path, work: Path, args: argparse.Namespace) -> Server:
    port = free_port()
    log = work / "peer.log"
    command = [
        *pinned(args.cores),
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        "peer",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(args.threads),
        "--n_threads_batch",
        str(args.threads),
        "--n_ctx",
        str(args.context),
        "--interrupt_requests",
        "False",
    ]
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=work)
    return Server("peer", port, process, "peer", {}, log)


def start_agent(package: Path, work: Path, args: argparse.Namespace) -> Server:
    port = free_port()
    token = secrets.token_hex(16)
    models = work / "models"
    models.mkdir()
    (models / package.name).symlink_to(package.resolve())
    config = work / "agent.toml"
    config.write_text(
        f"[hardware]\nthreads = {args.threads}\n[server]\ntoken = '{token}'\n"
        f"[llm]\nthreads = {args.threads}\ncontext = {args.context}\n"
        f"sequences = {args.streams}\n"
    )
    log = work / "agent.log"
    argv = ["--config", str(config), "--models-dir", str(models)]
    argv += ["--socket", str(work / "agent.sock"), "--port", str(port)]
    with log.open("w") as sink:
        process = spawn_agent(
            argv,
            state=work / "state",
            prefix=pinned(args.cores),
            stdout=subprocess.DEVNULL,
            stderr=sink,
            cwd=work,
        )
    name = _package_name(package)
    return Server("agent", port, process, name, {"Authorization": f"Bearer {token}"}, log)


def _package_name(package: Path) -> str:
    import tomllib

    return str(tomllib.loads((package / "model.toml").read_text())["name"])


async def wait_serving(server: Server, timeout: float = 300) -> None:
    """Until /v1/models lists the model; SystemExit with the log's end if the server dies."""

    async def listed() -> bool:
        if server.process.poll() is not None:
            tail = server.log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{server.name} exited with {server.process.returncode}:\n{tail}")
        try:
            async with (
                http_client(server.port) as client,
                client.get("/v1/models", headers=server.headers) as answer,
            ):
                if answer.status != 200:
                    return False
                body = await answer.json()
            return any(m.get("id") == server.model for m in body.get("data", []))
        except (OSError, ValueError, asyncio.TimeoutError):
            return False
        except Exception as exc:  # aiohttp's connection errors before it listens
            return "Cannot connect" in str(exc) or "Server disconnected" in str(exc)

    try:
        await until(listed, timeout, poll_s=0.1)
    except AssertionError:
        raise SystemExit(f"{server.name} did not list its model within {timeout} s") from None


async def stream_completion(server: Server, client: Any, max_tokens: int) -> Stream:
    """POST /v1/completions with stream=true; times of the chunks that carry text."""
    body = {
        "model": server.model,
        "prompt": prompt(),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    stamps: list[float] = []
    tokens = 0  # from the usage chunk where the server sends one; else one per text chunk
    async with client.post("/v1/completions", json=body, headers=server.headers) as answer:
        if answer.status != 200:
            raise SystemExit(f"{server.name}: {answer.status} {await answer.text()}")
        async for raw in answer.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
            choices = chunk.get("choices") or []
            if choices and choices[0].get("text"):
                stamps.append(time.perf_counter())
    if not stamps:
        raise SystemExit(f"{server.name}: the stream carried no text")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return Stream(stamps[0] - started, tokens or len(stamps), stamps[-1] - stamps[0], gaps)


async def served_round(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """One stream, then ``streams`` concurrent ones."""
    async with http_client(server.port, limit=args.streams + 1) as client:
        one = await stream_completion(server, client, args.max_tokens)
        started = time.perf_counter()
        many = await asyncio.gather(
            *(stream_completion(server, client, args.max_tokens) for _ in range(args.streams))
        )
        wall = time.perf_counter() - started
    return {
        "tps": one.decode_tps,
        "ttft_s": one.ttft_s,
        "aggregate_tps": sum(s.tokens for s in many) / wall,
        "inter_token_p95_s": [p95(s.gaps) for s in many],
    }


# ---- in this process -----------------------------------------------------------------------


@contextlib.contextmanager
def on_cores(cores: str) -> Iterator[None]:
    """This process on ``cores`` (the servers' cores) for an in-process measurement."""
    before = os.sched_getaffinity(0)
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def llama_in_process(gguf: Path, args: argparse.Namespace) -> Any:
    from llama_cpp import Llama

    return Llama(
        str(gguf),
        n_ctx=args.context,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )


def llama_round(llama: Any, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    stamps = []
    for chunk in llama.create_completion(
        prompt(), max_tokens=args.max_tokens, temperature=0.0, stream=True
    ):
        if chunk["choices"][0]["text"]:
            stamps.append(time.perf_counter())
    one = Stream(stamps[0] - started, len(stamps), stamps[-1] - stamps[0])
    return {"tps": one.decode_tps, "ttft_s": one.ttft_s}


def openvino_pipeline(gguf: Path, args: argparse.Namespace) -> tuple[Any, str]:
    """The GenAI pipeline on the GGUF, or None and why not."""
    try:
        import openvino_genai
    except ImportError as exc:
        return (
            None,
            f"openvino-genai is not installed ({exc}): pip install 'edgeagent[llm-openvino]'",
        )
    try:
        config = {"INFERENCE_NUM_THREADS": args.threads}
        return openvino_genai.LLMPipeline(str(gguf), "CPU", **config), ""
    except Exception as exc:  # its GGUF reader takes a few architectures and quantizations
        return None, f"OpenVINO GenAI cannot read {gguf.name}: {str(exc).splitlines()[0][:300]}"


def openvino_round(pipeline: Any, args: argparse.Namespace) -> dict[str, Any]:
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = args.max_tokens
    config.do_sample = False
    stamps: list[float] = []

    def streamer(text: str) -> openvino_genai.StreamingStatus:
        if text:
            stamps.append(time.perf_counter())
        return openvino_genai.StreamingStatus.RUNNING

    started = time.perf_counter()
    pipeline.generate(prompt(), config, streamer)
    one = Stream(stamps[0] - started, len(stamps), stamps[-1] - stamps[0])
    return {"tps": one.decode_tps, "ttft_s": one.ttft_s}


# ---- the run -------------------------------------------------------------------------------


def package_for(gguf: Path, work: Path, args: argparse.Namespace) -> Path:
    if args.package:
        return Path(args.package)
    if gguf == GGUF and (ZOO_PACKAGE / "model.toml").is_file():
        return ZOO_PACKAGE
    out = work / "package"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeagent.cli",
            "package",
            str(gguf),
            "--out",
            str(out),
            "--threads",
            str(args.threads),
        ],
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return out


def median(rounds: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    gguf = Path(args.gguf).resolve()
    sides = [s for s in SIDES if s not in args.skip]
    result: dict[str, Any] = {
        "gguf": gguf.name,
        "threads": args.threads,
        "cores": args.cores,
        "context": args.context,
        "max_tokens": args.max_tokens,
        "streams": args.streams,
        "rounds": args.rounds,
        "cpu": _cpu_name(),
        "notes": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        work = Path(tmp)
        servers: dict[str, Server] = {}
        try:
            if "peer" in sides:
                (work / "peer").mkdir()
                servers["peer"] = start_peer(gguf, work / "peer", args)
            if "agent" in sides:
                (work / "agent").mkdir()
                package = package_for(gguf, work, args)
                servers["agent"] = start_agent(package, work / "agent", args)
            for server in servers.values():
                await wait_serving(server)
            local: dict[str, Any] = {}
            if "in-process" in sides:
                local["in-process"] = llama_in_process(gguf, args)
            if "openvino" in sides:
                pipeline, why = openvino_pipeline(gguf, args)
                if pipeline is None:
                    result["notes"]["openvino"] = why
                    sides.remove("openvino")
                else:
                    local["openvino"] = pipeline
            rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}

            async def measure(side: str) -> dict[str, Any]:
                if side in servers:
                    return await served_round(servers[side], args)
                with on_cores(args.cores):
                    if side == "openvino":
                        return await asyncio.to_thread(openvino_round, local[side], args)
                    return await asyncio.to_thread(llama_round, local[side], args)

            for side in sides:  # warm-up: first requests load pages and build graphs
                await measure(side)
            result["rss_mb"] = {name: round(s.rss_mb(), 1) for name, s in servers.items()}
            for index in range(args.rounds):
                order = sides[index % len(sides) :] + sides[: index % len(sides)]
                for side in order:
                    rounds[side].append(await measure(side))
                print(f"bench_llm: round {index + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for server in servers.values():
                stop_tree(server.process)
    result["sides"] = {side: _summary(samples) for side, samples in rounds.items()}
    result["ratios"] = _ratios(result["sides"], result.get("rss_mb", {}))
    return result


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    summary = {
        "tps": round(median(samples, "tps"), 1),
        "ttft_ms": round(1000 * median(samples, "ttft_s"), 1),
    }
    if "aggregate_tps" in samples[0]:
        summary["aggregate_tps"] = round(median(samples, "aggregate_tps"), 1)
        per_stream = zip(*(s["inter_token_p95_s"] for s in samples), strict=True)
        summary["inter_token_p95_ms"] = [
            round(1000 * statistics.median(values), 1) for values in per_stream
        ]
    return summary


def _ratios(sides: dict[str, Any], rss: dict[str, float]) -> dict[str, float]:
    ratios: dict[str, float] = {}
    agent, peer, local = sides.get("agent"), sides.get("peer"), sides.get("in-process")
    if agent and peer:
        ratios["one_stream_tps_agent_over_peer"] = round(agent["tps"] / peer["tps"], 3)
        ratios["ttft_agent_over_peer"] = round(agent["ttft_ms"] / peer["ttft_ms"], 3)
        ratios["four_streams_agent_over_peer"] = round(
            agent["aggregate_tps"] / peer["aggregate_tps"], 3
        )
        if "agent" in rss and "peer" in rss:
            ratios["rss_agent_minus_peer_mb"] = round(rss["agent"] - rss["peer"], 1)
    if agent and local:
        ratios["one_stream_tps_agent_over_in_process"] = round(agent["tps"] / local["tps"], 3)
    if peer and local:
        ratios["one_stream_tps_peer_over_in_process"] = round(peer["tps"] / local["tps"], 3)
    if sides.get("openvino") and local:
        ratios["openvino_over_llama_cpp_in_process"] = round(
            sides["openvino"]["tps"] / local["tps"], 3
        )
    return ratios


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def table(result: dict[str, Any]) -> str:
    head = "| side | 1 stream tok/s | TTFT ms | 4 streams tok/s | inter-token p95 ms | RSS MB |"
    lines = [head, "|---|---|---|---|---|---|"]
    for side, s in result["sides"].items():
        p95s = ", ".join(f"{v:g}" for v in s.get("inter_token_p95_ms", [])) or "—"
        lines.append(
            f"| {side} | {s['tps']} | {s['ttft_ms']} | {s.get('aggregate_tps', '—')} | {p95s} | "
            f"{result.get('rss_mb', {}).get(side, '—')} |"
        )
    lines += ["", *(f"- {k}: {v}" for k, v in result["ratios"].items())]
    lines += [f"- {k}: {v}" for k, v in result["notes"].items()]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=str(GGUF), help="the model file every side runs")
    parser.add_argument(
        "--package", help="the agent's package of it (default: zoo/smollm2 or packaged here)"
    )
    parser.add_argument("--threads", type=int, default=2, help="threads of every side")
    parser.add_argument("--cores", default="0,1", help="taskset cores of every side ('' = any)")
    parser.add_argument("--context", type=int, default=2048, help="KV-cache tokens of a server")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per completion")
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    parser.add_argument(
        "--skip", action="append", default=[], choices=SIDES, help="leave a side out"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
