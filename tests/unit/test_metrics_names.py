"""/metrics follows Prometheus' naming conventions, carries build info and counts demotions."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgeagent import __version__
from edgeagent.api.http.app import HttpMetrics
from edgeagent.engine.metrics import EngineMetrics, new_registry
from edgeagent.governor.metrics import GovernorMetrics
from edgeagent.models.package import load_package
from tests.support.hardware import (
    board_accelerators,
    install_flaky,
    write_multi_package,
)

ORT = "onnxruntime:CPUExecutionProvider:fp32"
OV = "openvino:CPU:fp32"


def _exposition() -> str:
    """Every metric the daemon registers, on one registry, as /metrics serves them."""
    registry = new_registry()
    EngineMetrics(registry)
    GovernorMetrics(registry)
    HttpMetrics(registry)
    return generate_latest(registry).decode()


def test_names_units_and_labels_follow_the_conventions() -> None:
    families = list(text_string_to_metric_families(_exposition()))
    names = {f.name for f in families}
    assert "edgeagent_governor_battery_ratio" in names
    assert "edgeagent_http_errors_total" not in names and "edgeagent_http_errors" not in names
    for family in families:
        if not family.name.startswith("edgeagent_"):
            continue
        assert not family.name.endswith("_percent"), f"{family.name}: use a 0-1 ratio"
        if family.type == "gauge":
            assert "_total" not in family.name, f"{family.name}: _total is for counters"
        for sample in family.samples:
            assert family.name not in sample.labels, f"{family.name}: label repeats the name"


def test_build_info_names_the_version_and_every_runtime() -> None:
    (info,) = [
        f for f in text_string_to_metric_families(_exposition()) if f.name == "edgeagent_build_info"
    ]
    (sample,) = info.samples
    assert sample.value == 1
    assert sample.labels["version"] == __version__
    assert {"onnxruntime", "litert", "openvino"} <= set(sample.labels)
    assert sample.labels["onnxruntime"]  # a base dependency: always installed


def test_promtool_accepts_the_exposition(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=_exposition(), capture_output=True, text=True
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_a_demotion_is_counted_per_model_and_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky = install_flaky(monkeypatch)
    flaky.good_calls = 2  # the probe run + one request, then the "device" is gone
    registry = new_registry()
    metrics = EngineMetrics(registry)
    acc = board_accelerators(
        tmp_path,
        [ORT, OV],
        reprobe_backoff_s=60.0,
        on_demote=lambda model, key: metrics.demotions.labels(model, key).inc(),
    )
    package = load_package(
        write_multi_package(tmp_path / "pkg", [("onnxruntime", "fp32"), ("openvino", "fp32")])
    )
    session = acc.open(package)
    batch = np.zeros((2, 3, 8, 8), dtype=np.float32)

    def demotions(candidate: str) -> float | None:
        return registry.get_sample_value(
            "edgeagent_accelerator_demotions_total", {"model": "tiny", "candidate": candidate}
        )

    session.run({"input": batch})
    assert demotions(ORT) in (None, 0.0)
    session.run({"input": batch})  # ORT breaks: demoted, the retry runs on OpenVINO
    assert session.candidate.key == OV
    assert demotions(ORT) == 1.0
    session.close()
