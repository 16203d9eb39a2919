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
    .venv/bin/python scripts/bench_llm.py --rounds 7 --out bench-out/llm.json
    .venv/bin/python scripts/bench_llm.py --gguf third-party-models/gemma-3-270m-q4_k_m.gguf \
        --skip agent                                       # a second architecture (--bench fetch)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.bench_daemon import stop_tree  # noqa: E402
from devtools.llm_servers import (  # noqa: E402
    Server,
    Stream,
    pinned,
    prompt,
    served_round,
    start_agent,
    start_peer,
    wait_serving,
)

GGUF = REPO / "third-party-models" / "smollm2-135m-instruct-q4_1.gguf"
ZOO_PACKAGE = REPO / "zoo" / "smollm2"
SIDES = ("agent", "peer", "in-process", "openvino")


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


class Child:
    """OpenVINO GenAI in a process of its own, on the same cores: its runtime's worker threads
    keep spinning after a generation and would slow llama.cpp in this process."""

    def __init__(self, gguf: Path, args: argparse.Namespace) -> None:
        command = [*pinned(args.cores), sys.executable, __file__, "--child", "openvino"]
        command += ["--gguf", str(gguf), "--threads", str(args.threads)]
        command += ["--max-tokens", str(args.max_tokens)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the OpenVINO child exited with {self.process.wait()}")
        return dict(json.loads(line))

    def round(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(30)


def child(args: argparse.Namespace) -> int:
    """--child openvino: load, say whether it could, then one round per line read."""
    pipeline, why = openvino_pipeline(Path(args.gguf), args)
    print(json.dumps({"ok": pipeline is not None, "why": why}), flush=True)
    if pipeline is None:
        return 0
    for _ in sys.stdin:
        print(json.dumps(openvino_round(pipeline, args)), flush=True)
    return 0


# ---- the run -------------------------------------------------------------------------------


def package_for(gguf: Path, work: Path, args: argparse.Namespace) -> Path:
    """--package when it holds one; else the zoo's for its GGUF; else packaged now (into
    --package when given, so a second run reuses it)."""
    given = Path(args.package) if args.package else None
    if given is not None and (given / "model.toml").is_file():
        return given
    if given is None and gguf == GGUF and (ZOO_PACKAGE / "model.toml").is_file():
        return ZOO_PACKAGE
    out = given or work / "package"
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
        stdout=sys.stderr,  # stdout is the report's
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
        local: dict[str, Any] = {}  # the in-process Llama, the OpenVINO child
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
            if "in-process" in sides:
                local["in-process"] = llama_in_process(gguf, args)
            if "openvino" in sides:
                local["openvino"] = Child(gguf, args)
                if not local["openvino"].ready["ok"]:
                    result["notes"]["openvino"] = local.pop("openvino").ready["why"]
                    sides.remove("openvino")
            rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}

            async def measure(side: str) -> dict[str, Any]:
                if side in servers:
                    return await served_round(servers[side], args)
                if side == "openvino":
                    return await asyncio.to_thread(local[side].round)
                with on_cores(args.cores):
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
            if "openvino" in local:
                local["openvino"].close()
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
        "--package",
        help="the agent's package of it; packaged into this directory when it holds none "
        "(default: zoo/smollm2, else packaged in a temporary directory)",
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
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON figures to this file")
    parser.add_argument("--child", choices=("openvino",), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2) + "\n"
    print(text if args.json else table(result), end="" if args.json else "\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
