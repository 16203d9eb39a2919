"""The two OpenAI-compatible servers scripts/bench_llm.py measures, and its streaming client.

``start_agent`` runs ``edgeagent run`` on a language package over loopback TCP with a token;
``start_peer`` runs llama-cpp-python's own ``python -m llama_cpp.server`` on the GGUF (requests
serialised: ``--interrupt_requests False``, so a second stream waits instead of cutting the
first); both pinned to the same cores by ``taskset``. ``stream_completion`` times one streamed
``/v1/completions`` as a client sees it: the first chunk with text (TTFT), each later one.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from devtools.agent_process import spawn_agent
from devtools.http_endpoint import http_client
from devtools.ports import free_port
from devtools.waiting import until

PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "The story begins on a stormy night, when"
)

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
