"""``edgeagent status``'s models table keeps to the terminal's width; reasons come in full below."""

from __future__ import annotations

from edgeagent.commands.status import fit_table, summary

REASON = (
    "invalid package: /var/lib/edgeagent/models/broken/model.toml: inputs[0].dtype: 'float99' "
    "is not one of float32, float16, int8, uint8, int16, int32, int64, bool; and then some more "
    "words so that the reason is as long as the ones operators saw, about 230 characters"
)
STATUS = {
    "agent": {"version": "0.1.0", "uptime_s": 60, "pid": 1},
    "profile": {"profile": "generic-x86_64", "description": "generic"},
    "models": {
        "broken": {"state": "UNAVAILABLE", "reason": REASON, "active_version": None},
        "tiny": {
            "state": "READY",
            "reason": "",
            "active_version": "1",
            "versions": {
                "1": {
                    "runtime": "onnxruntime",
                    "device": "CPUExecutionProvider",
                    "precision": "fp32",
                }
            },
        },
    },
}


def _table(text: str) -> list[str]:
    """The models table's lines: from its header to the line before ``governor``/``updates``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("models"))
    end = next(i for i, line in enumerate(lines) if line.startswith(("governor", "updates")))
    return lines[start:end]


def test_a_failed_package_keeps_the_table_within_the_width() -> None:
    for width in (60, 80, 120):
        lines = _table(summary(STATUS, {("tiny", "1"): (3, 1.5)}, "agent.sock", width))
        assert all(len(line) <= width for line in lines), (width, lines)
        assert lines[0].split()[:4] == ["models", "MODEL", "VERSION", "BACKEND"], lines[0]
        assert len(lines[0].split()) == 8, lines[0]  # every column is there ("P50 MS": 2)
        [broken] = [line for line in lines if line.split()[:1] == ["broken"]]
        assert broken.split()[-1].startswith("UNAV")  # the state alone, not the reason


def test_the_full_reason_is_listed_below_the_table() -> None:
    lines = _table(summary(STATUS, {}, "agent.sock", 80))
    rows = [i for i, line in enumerate(lines) if line.split()[:1] in (["broken"], ["tiny"])]
    below = lines[max(rows) + 1 :]
    assert " ".join(line.strip() for line in below) == f"broken: {REASON}"


def test_a_narrow_terminal_cuts_the_widest_cells_with_an_ellipsis() -> None:
    rows = [("MODEL", "BACKEND"), ("tiny", "onnxruntime/CPUExecutionProvider/fp32")]
    lines = fit_table(rows, 30)
    assert max(len(line) for line in lines) == 30
    assert lines[1] == "tiny   onnxruntime/CPUExecuti…"


def test_a_table_that_fits_is_left_as_it_is() -> None:
    assert fit_table([("A", "BB"), ("ccc", "d")], 80) == ["A    BB", "ccc  d"]


def test_an_idle_updater_is_not_said_to_be_installing() -> None:
    idle = {"state": "idle", "model": "", "version": "", "deployment_id": ""}
    mqtt = {"broker": "hub:1883", "connected": True}
    last = {"model": "m", "version": "2", "result": "succeeded"}
    text = summary({**STATUS, "updates": {"current": idle, "last": last, "mqtt": mqtt}}, {}, "s")
    (line,) = [line for line in text.splitlines() if line.startswith("updates")]
    assert "installing" not in line and "last" in line and '"version": "2"' in line
    busy = {**idle, "state": "downloading", "model": "m", "version": "3"}
    text = summary({**STATUS, "updates": {"current": busy, "mqtt": mqtt}}, {}, "s")
    assert '; installing {"state": "downloading"' in text


def test_a_version_whose_plan_is_searched_says_what_it_serves_on_meanwhile() -> None:
    versions = {"1": {"plan": {"instances": 1, "threads": 2, "max_batch_size": 8}}}
    tiny = {**STATUS["models"]["tiny"], "versions": versions}  # type: ignore[dict-item]
    searched = {**STATUS, "models": {"tiny": tiny}}
    versions["1"]["plan"]["source"] = "search"
    assert "pending" not in summary(searched, {}, "agent.sock", 120)
    versions["1"]["plan"]["source"] = "pending"
    text = " ".join(summary(searched, {}, "agent.sock", 120).split())
    assert "tiny 1: execution plan pending: serving 1x2:b8 (1 instance x 2 threads" in text


def test_each_language_model_shows_its_batch_kv_cache_and_decode_rate() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from edgeagent.commands.status import token_rates

    registry = CollectorRegistry()
    rate = Histogram(
        "edgeagent_llm_tokens_per_second", "", ["model"], registry=registry, buckets=(50, 100, 200)
    )
    for value in (60, 80, 120):  # the median falls in the 50–100 bucket
        rate.labels("smollm2").observe(value)
    rates = token_rates(generate_latest(registry).decode())
    assert 50 < (rates["smollm2"] or 0) <= 100
    language = {
        "models": {
            "smollm2": {
                "version": "1.0.0",
                "state": "READY",
                "runtime": "llama_cpp",
                "device": "CPU",
                "sequences": 8,
                "running": 2,
                "waiting": 5,
                "kv_bytes_used": 3 * 1024 * 1024,
                "kv_bytes_allocated": 24 * 1024 * 1024,
            },
            "gemma": {"state": "FAILED", "error": "does not fit: 900 MiB > 256 MiB"},
        }
    }
    text = summary({**STATUS, "language": language}, {}, "s", 120, rates)
    lines = [line for line in text.splitlines() if "smollm2" in line or "gemma" in line]
    assert lines[0].startswith("language  gemma") and "FAILED: does not fit" in lines[0]
    assert "llama_cpp/CPU: 2/8 running, 5 waiting; KV 3.0/24.0 MiB" in lines[1]
    assert lines[1].endswith(f"{rates['smollm2']:.0f} tokens/s median")
    assert "language" not in summary(STATUS, {}, "s", 120)  # none served: no line
