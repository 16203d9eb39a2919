"""`edgeagent infer` and `edgeagent bench` on the real zoo, through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeagent.cli import main


@pytest.mark.parametrize(
    ("runtime", "precision"),
    [("onnxruntime", "int8"), ("litert", "int8"), ("openvino", "fp32")],
)
def test_infer_classifies_a_jpeg_with_each_runtime(
    zoo: Path, runtime: str, precision: str, capsys: pytest.CaptureFixture[str]
) -> None:
    image = zoo / "samples" / "china.jpg"
    args = ["infer", "mobilenet_v3_small", str(image), "--models-dir", str(zoo), "--json"]
    assert main([*args, "--runtime", runtime, "--precision", precision, "--top-k", "3"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["runtime"] == runtime and result["precision"] == precision
    assert len(result["top_k"]) == 3
    labels = (zoo / "mobilenet_v3_small" / "labels.txt").read_text().split("\n")
    assert all(p["label"] == labels[p["index"]] for p in result["top_k"])
    scores = [p["score"] for p in result["top_k"]]
    assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1


def test_runtimes_agree_on_the_label_of_a_photo(
    zoo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = str(zoo / "samples" / "china.jpg")
    tops = []
    for runtime in ("onnxruntime", "litert", "openvino"):
        argv = ["infer", "mobilenet_v2", image, "--models-dir", str(zoo), "--json"]
        assert main([*argv, "--runtime", runtime, "--precision", "fp32"]) == 0
        tops.append(json.loads(capsys.readouterr().out)[0]["top_k"][0]["index"])
    assert len(set(tops)) == 1, f"FP32 top-1 differs between runtimes: {tops}"


def test_infer_without_flags_uses_the_profile_choice(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    image = str(zoo / "samples" / "digit_3.jpg")
    assert main(["infer", "mobilenet_v3_small", image, "--models-dir", str(zoo), "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    # Nothing but the CPU exists here, so the generic profile's best working candidate runs.
    assert result["device"] in ("CPUExecutionProvider", "CPU")
    assert (tmp_path / "edgeagent").is_dir(), "the probe cache lives in the state directory"


def test_infer_reports_bad_images_and_unknown_models(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    good = str(zoo / "samples" / "digit_0.png")
    argv = ["infer", "mobilenet_v3_small", str(text), good, "--models-dir", str(zoo)]
    assert main([*argv, "--runtime", "onnxruntime"]) == 1
    captured = capsys.readouterr()
    assert "notes.jpg: not a JPEG or PNG image" in captured.err
    assert "digit_0.png: mobilenet_v3_small" in captured.out  # the good image still ran
    assert main(["infer", "no_such_model", good, "--models-dir", str(zoo)]) == 2
    assert "no model package 'no_such_model'" in capsys.readouterr().err
    argv = ["infer", "mobilenet_v3_small", good, "--models-dir", str(zoo), "--precision", "fp16"]
    assert main(argv) == 2
    assert "has no variant for runtime=any precision=fp16" in capsys.readouterr().err


def test_infer_through_an_unreachable_socket_says_so(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = str(zoo / "samples" / "digit_0.png")
    assert main(["infer", "mobilenet_v2", image, "--socket", str(tmp_path / "none.sock")]) == 2
    assert "cannot reach the agent" in capsys.readouterr().err


def test_bench_prints_a_row_per_variant(zoo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "mobilenet_v3_small", "--models-dir", str(zoo), "--precision", "int8"]
    assert main([*argv, "--seconds", "0.3", "--warmup", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["runtime"] for r in rows} == {"onnxruntime", "litert", "openvino"}
    for row in rows:
        assert not row["error"], row
        assert row["iterations"] >= 5 and row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["throughput_ips"] > 0 and row["peak_rss_mb"] > 20
