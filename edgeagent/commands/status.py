"""``edgeagent status``: what a running agent is doing, asked over its socket or TCP.

The text is a summary an operator reads at a glance (board, each model version with its backend,
requests and median latency, governor, updates); ``--json`` prints the whole /v1/status document.
The models table keeps to the terminal's width (a long cell is cut with an ellipsis), and why a
model is not serving (an invalid package's error can be 200 characters) is written in full below
it, so one broken package never pushes the other columns off screen.
Requests and the median come from the agent's /metrics latency histogram, estimated the way
Prometheus' ``histogram_quantile`` does (linear within a bucket).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from edgeagent.api.client import AgentError, AgentUnreachable
from edgeagent.commands.connection import add_connection_arguments, client_from_args, socket_of
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.hardware.plan_shape import PENDING, PlanShape
from edgeagent.sections import ConfigError

LATENCY = "edgeagent_inference_latency_seconds"
TOKEN_RATE = "edgeagent_llm_tokens_per_second"  # each generation's decode rate, per model
MIB = 1024 * 1024
LABEL = 10  # the width of the label column ("models", "governor" …) every line starts with
MIN_CELL = 3  # a column cut to fit the terminal keeps at least this many characters


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        formatter_class=DefaultsFormatter,
        help="summarise a running agent: board, models and backends, governor, updates",
        description=(
            "Ask the running agent (GET /v1/status and /metrics) and print a summary: the board "
            "profile; per model version its backend (runtime/device/precision), requests "
            "answered and median latency; each language model's sequences running and waiting, "
            "KV cache in use and median tokens/s; the governor's state and actions; the update "
            "state; "
            "the device's public key (for 'hub sign --encrypt --recipients'). "
            "--json prints the whole status document. Connects to the Unix socket of the "
            "agent's config unless --socket or --url says otherwise. Exit status 2: bad "
            "arguments or config, or the agent cannot be reached; 1: it answered with an error."
        ),
    )
    add_connection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the whole status document")
    parser.add_argument(
        "--socket-path",
        action="store_true",
        help="print only the Unix socket the agent is asked on (for curl --unix-socket), "
        "without asking it; exit 1 when nothing is there",
    )
    parser.set_defaults(handler=run)


def latency_by_version(metrics_text: str) -> dict[tuple[str, str], tuple[int, float | None]]:
    """(model, version) → (requests answered, median latency in ms or None) from /metrics."""
    medians = histogram_medians(metrics_text, LATENCY, ("model", "version"))
    return {
        (key[0], key[1]): (count, None if median is None else median * 1000)
        for key, (count, median) in medians.items()
    }


def histogram_medians(
    metrics_text: str, family_name: str, labels: tuple[str, ...]
) -> dict[tuple[str, ...], tuple[int, float | None]]:
    """The values of ``labels`` → (observations, interpolated median or None) of a histogram."""
    buckets: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            if sample.name == f"{family_name}_bucket":
                key = tuple(sample.labels[label] for label in labels)
                bound = float(sample.labels["le"])
                buckets.setdefault(key, []).append((bound, sample.value))
    return {key: _median(sorted(rows)) for key, rows in buckets.items()}


def _median(rows: list[tuple[float, float]]) -> tuple[int, float | None]:
    """Count and interpolated median of cumulative buckets sorted by upper bound."""
    total = int(rows[-1][1]) if rows else 0
    if total == 0:
        return 0, None
    rank = total / 2
    lower, below = 0.0, 0.0
    for bound, cumulative in rows:
        if cumulative >= rank:
            if math.isinf(bound):
                return total, lower  # above the last finite bucket: its bound
            share = (rank - below) / (cumulative - below) if cumulative > below else 0.0
            return total, lower + (bound - lower) * share
        lower, below = bound, cumulative
    return total, None


def _since(seconds: float) -> str:
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


def _updates(updates: Mapping[str, Any] | None) -> str:
    if not updates:
        return "disabled"
    if "error" in updates:
        return f"error: {updates['error']}"
    current, last = updates.get("current"), updates.get("last")
    mqtt = updates.get("mqtt") or {}
    link = f"broker {mqtt.get('broker', '?')} {'connected' if mqtt.get('connected') else 'down'}"
    if current and current.get("state", "idle") != "idle":  # idle: nothing is being installed
        return f"{link}; installing {json.dumps(current, default=str)}"
    if last:
        return f"{link}; last {json.dumps(last, default=str)}"
    return f"{link}; nothing installed yet"


def fit_table(rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """``rows`` as left-aligned columns, two spaces apart, each line at most ``width`` wide.

    When the table is too wide the widest column gives up one character at a time (down to
    MIN_CELL), its longer cells cut with an ellipsis: a name or backend stays recognisable and
    every column stays on screen.
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    gaps = 2 * (len(widths) - 1)
    while sum(widths) + gaps > width and max(widths) > MIN_CELL:
        widths[widths.index(max(widths))] -= 1
    return [
        "  ".join(_cut(cell, w).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: width - 1] + "…"


def _pending(plan: Mapping[str, Any] | None) -> str:
    """What a version serves on while its execution plan is searched, or "" when it is not."""
    if not plan or plan.get("source") != PENDING or not plan.get("threads"):
        return ""
    shape = PlanShape(plan["instances"], plan["threads"], plan["max_batch_size"])
    return f"execution plan pending: serving {shape.label} ({shape.text}) until it is measured"


def summary(
    status: Mapping[str, Any],
    latencies: Mapping[tuple[str, str], tuple[int, float | None]],
    where: str,
    width: int = 80,
    rates: Mapping[str, float | None] | None = None,
) -> str:
    """The status as a few lines for a terminal ``width`` characters wide (see the module)."""
    agent = status.get("agent", {})
    profile = status.get("profile", {})
    lines = [
        f"edgeagent {agent.get('version', '?')} at {where} "
        f"(up {_since(agent.get('uptime_s', 0))}, pid {agent.get('pid', '?')})",
        f"board     {profile.get('profile', '?')}: {profile.get('description', '')}",
    ]
    rows = [("MODEL", "VERSION", "BACKEND", "STATE", "REQUESTS", "P50 MS")]
    details = []  # why each model that does not serve does not, in full below the table
    for name, model in sorted(status.get("models", {}).items()):
        versions = model.get("versions") or {}
        if model.get("state") != "READY" and model.get("reason"):
            details.append(f"{name}: {model['reason']}")
        if not versions:
            rows.append((name, "-", "-", str(model.get("state")), "", ""))
        for version, info in sorted(versions.items()):
            backend = f"{info.get('runtime')}/{info.get('device')}/{info.get('precision')}"
            active = version == model.get("active_version")
            state = model.get("state", "") if active else "standby"
            count, p50 = latencies.get((name, version), (0, None))
            median = f"{p50:.2f}" if p50 is not None else "-"
            rows.append((name, version, backend, state, str(count), median))
            pending = _pending(info.get("plan"))
            if pending:
                details.append(f"{name} {version}: {pending}")
    for index, line in enumerate(fit_table(rows, width - LABEL)):
        lines.append(f"{'models' if index == 0 else '':<{LABEL}}{line}")
    if len(rows) == 1:
        lines.append(f"{'':<{LABEL}}none loaded")
    for detail in details:  # whole words kept, so a path can be copied from the terminal
        lines += textwrap.wrap(
            detail,
            width,
            initial_indent=" " * LABEL,
            subsequent_indent=" " * (LABEL + 2),
            break_long_words=False,
            break_on_hyphens=False,
        )
    lines += language_lines(status.get("language"), rates or {})
    governor = status.get("governor", {})
    if governor:
        actions = ", ".join(governor.get("actions") or []) or "none"
        reason = f" ({governor['reason']})" if governor.get("reason") else ""
        lines.append(
            f"governor  {governor.get('state', '?')}{reason}; duty "
            f"{governor.get('duty_cycle', 1):.2f}; actions: {actions}"
        )
    lines.append(f"updates   {_updates(status.get('updates'))}")
    key = status.get("device_key") or {}
    if key.get("public_key"):  # what 'hub sign --encrypt --recipients' wraps keys for
        lines.append(f"key       {key['public_key']} ({key.get('scheme', '?')})")
    return "\n".join(lines)


def language_lines(
    language: Mapping[str, Any] | None, rates: Mapping[str, float | None]
) -> list[str]:
    """One line per language model: its state, sequences running and waiting of the batch,
    the KV cache in use of what is allocated, and the median decode rate (``rates``, from
    /metrics) of the generations so far."""
    lines: list[str] = []
    for name, model in sorted(((language or {}).get("models") or {}).items()):
        label = f"{'language' if not lines else '':<{LABEL}}{name} {model.get('version', '')}"
        state = model.get("state", "?")
        if state != "READY":
            error = f": {model['error']}" if model.get("error") else ""
            lines.append(f"{label.rstrip()} {state}{error}")
            continue
        used = model.get("kv_bytes_used", 0) / MIB
        allocated = model.get("kv_bytes_allocated", 0) / MIB
        rate = rates.get(name)
        speed = f"{rate:.0f} tokens/s median" if rate is not None else "no generations yet"
        lines.append(
            f"{label} {model.get('runtime', '?')}/{model.get('device', '?')}: "
            f"{model.get('running', 0)}/{model.get('sequences', '?')} running, "
            f"{model.get('waiting', 0)} waiting; KV {used:.1f}/{allocated:.1f} MiB; {speed}"
        )
    return lines


def token_rates(metrics_text: str) -> dict[str, float | None]:
    """model → median decode tokens/s of its generations, from /metrics."""
    medians = histogram_medians(metrics_text, TOKEN_RATE, ("model",))
    return {key[0]: median for key, (_, median) in medians.items()}


def _print_socket_path(args: argparse.Namespace) -> int:
    """The socket path alone on stdout, so a shell can use it whatever its environment."""
    if args.url:
        print("edgeagent status: --socket-path and --url exclude each other", file=sys.stderr)
        return 2
    try:
        path = args.socket if args.socket is not None else socket_of(args.config)
    except ConfigError as exc:
        print(f"edgeagent status: {exc}", file=sys.stderr)
        return 2
    print(path)
    if not path.is_socket():
        print(f"edgeagent status: no agent socket at {path}: is the agent running, "
              "and as this user? (the system service's is /run/edgeagent/agent.sock)",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    if args.socket_path:
        return _print_socket_path(args)
    try:
        client = client_from_args(args)
    except (ConfigError, ValueError) as exc:
        print(f"edgeagent status: {exc}", file=sys.stderr)
        return 2
    try:
        status = client.status()
        _, metrics = client.request("GET", "/metrics")
    except AgentError as exc:
        print(f"edgeagent status: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, AgentUnreachable) else 1
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    text = metrics.decode("utf-8", "replace")
    # $COLUMNS, else the terminal's width, else 80 (piped output: a log, a mail, a ticket).
    width = shutil.get_terminal_size().columns
    print(summary(status, latency_by_version(text), client.where, width, token_rates(text)))
    return 0
