"""The zoo's trained digits classifier through ``edgeagent package``: INT8 and OpenVINO variants
with validation figures on a labelled ImageFolder directory, then served and checked."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgeagent.api.client import AgentClient
from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from edgeagent.models.tasks import golden_problem
from tests.support.http_agent import AgentServer

HELDOUT = slice(100, 160)  # 60 labelled images, none of them among the calibration rows


def _image_folder(zoo: Path, root: Path) -> Path:
    """Held-out digits as PNGs in one directory per class (the ImageFolder layout)."""
    with np.load(zoo / "digits_mnv3" / "heldout.npz") as data:
        inputs, labels = data["inputs"][HELDOUT], data["labels"][HELDOUT]
    for index, (tensor, label) in enumerate(zip(inputs, labels, strict=True)):
        pixels = np.clip((tensor[0] * 0.5 + 0.5) * 255, 0, 255).round().astype(np.uint8)
        (root / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels, mode="L").save(root / str(label) / f"{index:03d}.png")
    return root


@pytest.fixture(scope="module")
def built(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("digits")
    digits = zoo / "digits_mnv3"
    with np.load(digits / "heldout.npz") as data:
        np.savez(tmp / "calibration.npz", inputs=data["inputs"][:64])
    out = tmp / "digits"
    argv = [
        "package",
        str(digits / "digits_mnv3.fp32.onnx"),
        "--name",
        "digits",
        "--labels",
        str(digits / "labels.txt"),
        "--mean",
        "0.5",
        "--std",
        "0.5",
        "--calibration",
        str(tmp / "calibration.npz"),
        "--heldout",
        str(_image_folder(zoo, tmp / "heldout")),
        "--variants",
        "graph,int8,openvino",
        "--threads",
        "1",
        "--out",
        str(out),
        "--json",
    ]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    return out, json.loads(stdout.getvalue())


@pytest.fixture(scope="module")
def agent(
    built: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentServer]:
    server = AgentServer(tmp_path_factory.mktemp("agent"), [built[0]]).start()
    yield server
    server.stop()


def test_variants_and_their_validation_figures(built: tuple[Path, dict]) -> None:
    out, report = built
    assert json.loads((out / "validation.json").read_text())["variants"] == report["variants"]
    figures = {f"{v['runtime']}/{v['precision']}": v for v in report["variants"]}
    assert set(figures) == {
        "onnxruntime/fp32",
        "onnxruntime/int8",
        "openvino/fp32",
        "openvino/int8",
    }
    assert report["rows"] == 60 and report["data"].startswith("--heldout")
    assert report["reference"]["accuracy"] >= 95  # a trained model on its own held-out digits
    for key, variant in figures.items():
        assert variant["kept"], (key, variant["reason"])
        assert variant["top1_agreement"] >= 95, key
        assert variant["top5_recall"] == 100, key
        assert variant["accuracy"] >= 93, key
        assert variant["timing"]["latency_ms_p50"] > 0 and variant["timing"]["peak_rss_mb"] > 0
    for key in ("onnxruntime/fp32", "openvino/fp32"):
        assert figures[key]["max_abs_error"] < 1e-3 and figures[key]["cosine_min"] > 0.99999
    assert figures["onnxruntime/int8"]["max_abs_error"] > 1e-3  # really quantized


def test_every_kept_variant_passes_the_golden_check(built: tuple[Path, dict]) -> None:
    package = load_package(built[0])
    assert package.golden is not None
    with np.load(package.golden) as data:
        golden = {key: data[key] for key in data.files}
    assert golden["topk"].shape == (len(golden["inputs"]), 5)
    for variant in package.variants:
        session = open_variant(package, variant.runtime, variant.precision, threads=1)
        outputs = session.run({"input": golden["inputs"]})
        session.close()
        assert golden_problem(package.task, ["logits"], golden, outputs, 1) == "", variant.key


def test_served_v2_answers_match_the_runtime(
    zoo: Path, built: tuple[Path, dict], agent: AgentServer
) -> None:
    client = AgentClient(socket_path=agent.socket, timeout=30)
    package = load_package(built[0])
    backend = client.status()["models"]["digits"]["versions"]["1.0.0"]
    with np.load(zoo / "digits_mnv3" / "heldout.npz") as data:
        batch = data["inputs"][HELDOUT][:8]
    served = client.infer("digits", {"input": batch}).outputs["logits"]
    session = open_variant(package, backend["runtime"], backend["precision"], threads=1)
    direct = session.run({"input": batch})["logits"]
    session.close()
    np.testing.assert_allclose(served, direct, rtol=1e-4, atol=1e-4)
    answer = client.classify("digits", (zoo / "samples" / "digit_3.jpg").read_bytes(), top_k=1)
    assert answer["labels"] == ["3"]
