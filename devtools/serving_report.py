"""How ``scripts/bench_serving.py`` shows its report: a markdown table, and latency box plots.

Rendering only: the figures (medians, ratios, peaks) are computed by the benchmark; this turns
its report dict into text and a PNG, and states the targets the figures are read against.
"""

from __future__ import annotations

from pathlib import Path

TARGET_IDLE_RSS_MB = 100  # an idle agent must leave a small board its memory
TARGET_OVERHEAD_MS = 0.3  # over the naive server: serving must cost next to the model's time


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if key in row else ""


def markdown(report: dict) -> str:
    raw = report["raw"]
    peers = bool(report.get("peers"))
    extra_head = " × naive | × MLServer |" if peers else ""
    extra_rule = "---:|---:|" if peers else ""
    lines = [
        f"Model {report['model']} ({report['backend']}), {report['cpus']} CPUs, "
        f"intra-op threads {report['threads'] or 'all cores'}, "
        f"{report['duration_s']:g} s per cell in {report['rounds']} rounds of every cell, each "
        "after a raw batch-1 round; req/s, p50 and ratios are medians of the rounds",
        "",
        "| path | concurrency | req/s | p50 ms | p99 ms | errors | raw req/s (same rounds) "
        "| × raw | p50 − raw p50 ms | server CPU ms/req | client CPU ms/req |" + extra_head,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + extra_rule,
        f"| raw batch-1 (all rounds) | 1 | {raw['throughput']:.1f} | {raw['p50_ms']:.2f} | "
        f"{raw['p99_ms']:.2f} | 0 | | | | | |" + (" | |" if peers else ""),
    ]
    for row in report["rows"]:
        ratios = f" {_ratio(row, 'x_naive')} | {_ratio(row, 'x_mlserver')} |" if peers else ""
        lines.append(
            f"| {row['mode'] if not peers else row['name']} | {row['concurrency']} | "
            f"{row['throughput']:.1f} | "
            f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['errors']} | "
            f"{row['raw_throughput']:.1f} | {row['ratio']:.2f} | {row['overhead_p50_ms']:+.2f} | "
            f"{row['daemon_cpu_ms']:.2f} | {row['client_cpu_ms']:.2f} |" + ratios
        )
    lines += [
        "",
        f"Daemon RSS idle (model loaded): {report['rss_idle_mb']:.0f} MB "
        f"(target ≤ {TARGET_IDLE_RSS_MB}); peak under load: {report['rss_loaded_mb']:.0f} MB; "
        f"runtimes mapped: {', '.join(report['runtimes_mapped'])}",
        f"p50 overhead at c=1, v2 binary vs raw: {report['overhead_c1_ms']:.2f} ms "
        f"(target ≤ {TARGET_OVERHEAD_MS})",
        f"v2 binary c=16 throughput / raw batch-1: {report['c16_ratio']:.2f} (target ≥ 1)",
        f"v2 binary c=16 throughput / the served plan in process: {report['c16_over_plan']:.2f}",
    ]
    if report["floor_p50_ms"] == report["floor_p50_ms"]:  # measured (not NaN)
        lines.append(
            f"HTTP floor at c=1 (the naive server answering without its model): p50 "
            f"{report['floor_p50_ms']:.2f} ms, the least any served p50 adds to raw here"
        )
    for server, peak in report.get("peak_rss_mb", {}).items():
        lines.append(f"Peak RSS under load, {server}: {peak:.0f} MB")
    naive = report["naive_ready_s"]
    lines.append(
        f"Start → ready on a fresh state: edgeagent {report['ready_s']:.2f} s (its execution "
        f"plan measured at {report['plan_settled_s']:.2f} s)"
        + (f", the naive server {naive:.2f} s" if naive == naive else "")
    )
    lines += report.get("notes", [])
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Box plots of the latencies of every cell (log scale), raw batch-1 first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    labels = ["raw batch-1"] + [f"{r['name']}\nc={r['concurrency']}" for r in rows]
    data = [report["raw_latencies"]] + [r["_latencies"] for r in rows]
    figure, axes = plt.subplots(figsize=(max(8, len(labels) * 0.9), 5))
    axes.boxplot([[v * 1e3 for v in d] or [float("nan")] for d in data], showfliers=False)
    axes.set_xticks(range(1, len(labels) + 1), labels, fontsize=7, rotation=90)
    axes.set_yscale("log")
    axes.set_ylabel("latency per request (ms, log scale)")
    axes.set_title(f"{report['model']} on {report['backend']}: raw in-process vs served")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
