"""``edgeagent status``: what a running agent is doing, asked over its socket or TCP.

The text is a summary an operator reads at a glance (board, each model version with its backend,
requests and median latency, governor, updates); ``--json`` prints the whole /v1/status document.
Requests and the median come from the agent's /metrics latency histogram, estimated the way
Prometheus' ``histogram_quantile`` does (linear within a bucket).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from edgeagent.api.client import AgentError, AgentUnreachable
from edgeagent.commands.connection import add_connection_arguments, client_from_args
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.sections import ConfigError

LATENCY = "edgeagent_inference_latency_seconds"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        formatter_class=DefaultsFormatter,
        help="summarise a running agent: board, models and backends, governor, updates",
        description=(
            "Ask the running agent (GET /v1/status and /metrics) and print a summary: the board "
            "profile; per model version its backend (runtime/device/precision), requests "
            "answered and median latency; the governor's state and actions; the update state; "
            "the device's public key (for 'hub sign --encrypt --recipients'). "
            "--json prints the whole status document. Connects to the Unix socket of the "
            "agent's config unless --socket or --url says otherwise. Exit status 2: bad "
            "arguments or config, or the agent cannot be reached; 1: it answered with an error."
        ),
    )
    add_connection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the whole status document")
    parser.set_defaults(handler=run)


def latency_by_version(metrics_text: str) -> dict[tuple[str, str], tuple[int, float | None]]:
    """(model, version) → (requests answered, median latency in ms or None) from /metrics."""
    buckets: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != LATENCY:
            continue
        for sample in family.samples:
            if sample.name == f"{LATENCY}_bucket":
                key = (sample.labels["model"], sample.labels["version"])
                bound = float(sample.labels["le"])
                buckets.setdefault(key, []).append((bound, sample.value))
    return {key: _median(sorted(rows)) for key, rows in buckets.items()}


def _median(rows: list[tuple[float, float]]) -> tuple[int, float | None]:
    """Count and interpolated median (ms) of cumulative buckets sorted by upper bound."""
    total = int(rows[-1][1]) if rows else 0
    if total == 0:
        return 0, None
    rank = total / 2
    lower, below = 0.0, 0.0
    for bound, cumulative in rows:
        if cumulative >= rank:
            if math.isinf(bound):
                return total, lower * 1000  # above the last finite bucket: its bound
            share = (rank - below) / (cumulative - below) if cumulative > below else 0.0
            return total, (lower + (bound - lower) * share) * 1000
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
    if current:
        return f"{link}; installing {json.dumps(current, default=str)}"
    if last:
        return f"{link}; last {json.dumps(last, default=str)}"
    return f"{link}; nothing installed yet"


def summary(
    status: Mapping[str, Any],
    latencies: Mapping[tuple[str, str], tuple[int, float | None]],
    where: str,
) -> str:
    """The status as a few lines for a terminal."""
    agent = status.get("agent", {})
    profile = status.get("profile", {})
    lines = [
        f"edgeagent {agent.get('version', '?')} at {where} "
        f"(up {_since(agent.get('uptime_s', 0))}, pid {agent.get('pid', '?')})",
        f"board     {profile.get('profile', '?')}: {profile.get('description', '')}",
    ]
    rows = [("MODEL", "VERSION", "BACKEND", "STATE", "REQUESTS", "P50 MS")]
    for name, model in sorted(status.get("models", {}).items()):
        versions = model.get("versions") or {}
        if not versions:
            rows.append((name, "-", "-", f"{model.get('state')} {model.get('reason', '')}", "", ""))
        for version, info in sorted(versions.items()):
            backend = f"{info.get('runtime')}/{info.get('device')}/{info.get('precision')}"
            active = version == model.get("active_version")
            state = model.get("state", "") if active else "standby"
            count, p50 = latencies.get((name, version), (0, None))
            median = f"{p50:.2f}" if p50 is not None else "-"
            rows.append((name, version, backend, state, str(count), median))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        cells = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append(f"{'models' if index == 0 else '':<10}{cells.rstrip()}")
    if len(rows) == 1:
        lines.append(f"{'':<10}none loaded")
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


def run(args: argparse.Namespace) -> int:
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
    print(summary(status, latency_by_version(metrics.decode("utf-8", "replace")), client.where))
    return 0
