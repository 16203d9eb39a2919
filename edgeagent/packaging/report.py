"""The validation table ``edgeagent package`` prints at the end."""

from __future__ import annotations

from edgeagent.packaging.build import Result
from edgeagent.packaging.validate import VariantReport


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _task_figure(report: VariantReport) -> str:
    """The figure the variant was judged by beyond top-1: mAP against fp32's boxes, or IoU."""
    if report.map_vs_fp32 is not None:
        return f"mAP {report.map_vs_fp32:.3f}"
    if report.mask_iou is not None:
        return f"mIoU {report.mask_iou:.3f}"
    return "—"


def table(result: Result) -> str:
    head = (
        "variant",
        "device",
        "kept",
        "top-1 agr %",
        "top-5 rec %",
        "acc %",
        "task",
        "rel err",
        "max abs err",
        "cos min",
        "p50 ms",
        "RSS MB",
    )
    ref = result.reference
    rows = [
        (
            f"{ref.get('precision', 'fp32')} reference",
            "cpu",
            "ref",
            "100.00",
            "100.00",
            _num(ref.get("accuracy")),
            "—",
            "0",
            "0",
            "1",
            _num(ref.get("latency_ms_p50"), 3),
            _num(ref.get("peak_rss_mb"), 0),
        )
    ]
    for r in result.reports:
        rows.append(
            (
                r.key,
                r.device_class,
                "yes" if r.kept else "no",
                _num(r.top1_agreement),
                _num(r.top5_recall),
                _num(r.accuracy),
                _task_figure(r),
                _num(r.relative_error, 4),
                _num(
                    r.max_abs_error,
                    6 if r.max_abs_error is not None and r.max_abs_error < 0.01 else 4,
                ),
                _num(r.cosine_min, 6),
                _num(r.timing.get("latency_ms_p50"), 3),
                _num(r.timing.get("peak_rss_mb"), 0),
            )
        )
    widths = [max(len(str(row[i])) for row in (head, *rows)) for i in range(len(head))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (head, *rows)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {r.key}: {r.reason}" for r in result.reports if r.reason]
    summary = (
        f"{result.out}: {sum(r.kept for r in result.reports)} variant(s) kept of "
        f"{len(result.reports)}, validated on {result.data}, in {result.seconds:.1f} s"
    )
    return "\n".join([*lines, *(["notes:", *notes] if notes else []), summary])
