"""Choice per model on real runtimes: ranking ∩ variants ∩ probes, `fastest`, and the caches."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from devtools.package import set_fields
from edgeagent import runtimes
from edgeagent.hardware.choose import Chooser, options_for, why_not
from edgeagent.hardware.probe import CACHE_FILE, ProbeCache, Prober, ProbeResult
from edgeagent.hardware.profile import load_profile
from edgeagent.models.package import load_package
from edgeagent.runtimes import LoadRequest, get_runtime
from edgeagent.runtimes.onnx import OnnxRuntime
from tests.support.hardware import write_multi_package, write_profile
from tests.support.helpers import write_tiny_onnx

CPU = "onnxruntime:CPUExecutionProvider"


@pytest.fixture
def package(tmp_path: Path):
    root = write_multi_package(
        tmp_path / "pkg", [("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("openvino", "fp32")]
    )
    return load_package(root)


def _prober(state: Path, **kw) -> Prober:
    return Prober(
        ProbeCache(state / CACHE_FILE),
        threads=1,
        compiled_dir=state / "compiled",
        timeout_s=kw.pop("timeout_s", 60.0),
        failure_ttl_s=kw.pop("failure_ttl_s", 3600.0),
        **kw,
    )


def test_options_intersect_profile_and_variants(tmp_path: Path, package) -> None:
    profile = load_profile(
        write_profile(tmp_path, "p", ["litert:CPU:int8", f"{CPU}:int8", "openvino:CPU:fp32"])
    )
    options = options_for(profile, package)
    assert [o.key for o in options] == ["litert:CPU:int8", f"{CPU}:int8", "openvino:CPU:fp32"]
    assert "package has no litert/int8 variant" in options[0].dropped
    assert options[1].variant is not None and options[1].variant.precision == "int8"
    assert not options[2].dropped


def test_ranked_takes_first_that_really_works(tmp_path: Path, package) -> None:
    profile = load_profile(
        write_profile(
            tmp_path,
            "p",
            ["onnxruntime:CUDAExecutionProvider:fp32", "openvino:NPU:fp32", f"{CPU}:int8"],
        )
    )
    choice = Chooser(_prober(tmp_path / "state")).choose(profile, package)
    assert choice.chosen is not None and choice.chosen.key == f"{CPU}:int8"
    assert choice.session is not None
    cuda = choice.results["onnxruntime:CUDAExecutionProvider:fp32"]
    assert not cuda.ok and "CUDAExecutionProvider" in cuda.error  # onnxruntime's own words
    npu = choice.results["openvino:NPU:fp32"]
    assert not npu.ok and "NPU" in npu.error
    assert why_not(choice, choice.options[1]) == npu.error
    choice.session.close()


def test_failed_probe_is_cached_and_reused(tmp_path: Path, package) -> None:
    profile = load_profile(write_profile(tmp_path, "p", ["openvino:NPU:fp32", f"{CPU}:fp32"]))
    state = tmp_path / "state"
    Chooser(_prober(state)).choose(profile, package).session.close()
    cache = json.loads((state / CACHE_FILE).read_text())
    keys = list(cache["probes"])
    assert any("|openvino:NPU:fp32|openvino@" in k for k in keys)
    assert all(k.startswith(package.content_hash()) for k in keys)
    again = Chooser(_prober(state)).choose(profile, package)
    assert again.results["openvino:NPU:fp32"].cached
    assert not again.results[f"{CPU}:fp32"].cached  # a success is proven again by loading
    again.session.close()
    expired = Chooser(_prober(state, failure_ttl_s=0.0)).choose(profile, package)
    assert not expired.results["openvino:NPU:fp32"].cached
    expired.session.close()


def test_corrupt_cache_is_ignored(tmp_path: Path, package) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / CACHE_FILE).write_text("{not json")
    profile = load_profile(write_profile(tmp_path, "p", [f"{CPU}:fp32"]))
    choice = Chooser(_prober(state)).choose(profile, package)
    assert choice.chosen is not None
    choice.session.close()
    assert json.loads((state / CACHE_FILE).read_text())["format"] == 1


def test_broken_model_file_fails_its_probe_with_the_runtime_error(tmp_path: Path, package):
    (package.root / "tiny.onnxruntime.int8.onnx").write_bytes(b"\x08\x07garbage-not-a-model")
    profile = load_profile(write_profile(tmp_path, "p", [f"{CPU}:int8", "openvino:CPU:fp32"]))
    choice = Chooser(_prober(tmp_path / "state")).choose(profile, package)
    assert choice.chosen is not None and choice.chosen.key == "openvino:CPU:fp32"
    error = choice.results[f"{CPU}:int8"].error
    assert "could not load tiny.onnxruntime.int8.onnx" in error
    choice.session.close()


def test_fastest_times_top_k_and_caches_the_decision(tmp_path: Path, package) -> None:
    profile = load_profile(
        write_profile(tmp_path, "p", [f"{CPU}:int8", f"{CPU}:fp32", "openvino:CPU:fp32"])
    )
    state = tmp_path / "state"
    chooser = Chooser(_prober(state), mode="fastest", top_k=2, seconds=0.05)
    choice = chooser.choose(profile, package)
    assert set(choice.latency_ms) == {f"{CPU}:int8", f"{CPU}:fp32"}  # only the top 2
    assert choice.chosen.key == min(choice.latency_ms, key=choice.latency_ms.get)
    assert choice.reason.startswith("fastest of 2 timed")
    choice.session.close()
    decision = json.loads((state / CACHE_FILE).read_text())["decisions"]
    (entry,) = decision.values()
    assert entry["candidate"] == choice.chosen.key
    assert set(entry["versions"]) == {"onnxruntime", "openvino"}

    cached = Chooser(_prober(state), mode="fastest", top_k=2, seconds=0.05).choose(profile, package)
    assert cached.reason.startswith("fastest: decision cached")
    assert cached.chosen.key == choice.chosen.key
    assert list(cached.results) == [choice.chosen.key]  # nothing else was loaded or timed
    cached.session.close()


def test_fastest_decision_invalidated_by_runtime_upgrade_and_model_change(tmp_path, package):
    profile = load_profile(write_profile(tmp_path, "p", [f"{CPU}:int8", f"{CPU}:fp32"]))
    state = tmp_path / "state"

    def choose():
        choice = Chooser(_prober(state), mode="fastest", seconds=0.02).choose(profile, package)
        choice.session.close()
        return choice

    choose()
    path = state / CACHE_FILE
    data = json.loads(path.read_text())
    for entry in data["decisions"].values():
        entry["versions"]["onnxruntime"] = "1.0.0"  # the decision was made on an older runtime
    path.write_text(json.dumps(data))
    assert choose().reason.startswith("fastest of 2 timed")

    old_hash = package.content_hash()
    set_fields(package.root, {"version": "2"})
    changed = load_package(package.root)
    assert changed.content_hash() != old_hash
    choice = Chooser(_prober(state), mode="fastest", seconds=0.02).choose(profile, changed)
    assert choice.reason.startswith("fastest of 2 timed")
    choice.session.close()
    assert len(json.loads(path.read_text())["decisions"]) == 2


def test_fastest_respects_the_power_budget(tmp_path: Path, package) -> None:
    profile = load_profile(write_profile(tmp_path, "p", [f"{CPU}:int8", f"{CPU}:fp32"]))
    # Average watts per timing window: the int8 run draws 20 W, the fp32 run 6 W.
    readings = iter([0.0, 20.0, 0.0, 6.0])
    chooser = Chooser(
        _prober(tmp_path / "s"),
        mode="fastest",
        seconds=0.02,
        power_budget_w=10.0,
        power_w=lambda: next(readings),
    )
    choice = chooser.choose(profile, package)
    assert choice.power_w == {f"{CPU}:int8": 20.0, f"{CPU}:fp32": 6.0}
    assert choice.chosen.key == f"{CPU}:fp32"
    assert "within 10 W" in choice.reason
    choice.session.close()


def test_no_working_candidate(tmp_path: Path, package) -> None:
    profile = load_profile(write_profile(tmp_path, "p", ["openvino:NPU:fp32", "litert:CPU:int8"]))
    choice = Chooser(_prober(tmp_path / "s")).choose(profile, package)
    assert choice.chosen is None and choice.session is None
    assert choice.reason == "no candidate works"
    assert choice.fallback_order() == [choice.options[0]]


@pytest.mark.parametrize(
    ("broken_file", "broken_key"),
    [
        ("tiny.openvino.fp32.onnx", "openvino:CPU:fp32"),
        ("tiny.onnxruntime.int8.onnx", f"{CPU}:int8"),
    ],
)
def test_a_candidate_giving_wrong_answers_is_dropped(
    tmp_path: Path, package, broken_file: str, broken_key: str
) -> None:
    """The golden inputs catch a device that runs but computes garbage, int8 ones too."""
    rng = np.random.default_rng(5)
    inputs = rng.standard_normal((16, 3, 8, 8)).astype(np.float32) + rng.standard_normal(
        (16, 3, 1, 1)
    ).astype(np.float32)
    reference = get_runtime("onnxruntime").load(
        LoadRequest(files=(package.root / "tiny.fp32.onnx",))
    )
    top1 = reference.run({"input": inputs})["logits"].argmax(1)
    np.savez(package.root / "golden.npz", inputs=inputs, top1=top1)
    write_tiny_onnx(package.root / broken_file, seed=7)  # other weights: garbage
    toml = package.root / "model.toml"
    toml.write_text('golden = "golden.npz"\n' + toml.read_text())
    golden_package = load_package(package.root)
    profile = load_profile(write_profile(tmp_path, "p", [broken_key, f"{CPU}:fp32"]))
    prober = _prober(tmp_path / "s", golden_agreement=0.9)
    choice = Chooser(prober).choose(profile, golden_package)
    assert choice.chosen.key == f"{CPU}:fp32"
    assert "wrong answers: top-1 matches golden.npz on" in choice.results[broken_key].error
    choice.session.close()


class _HungOnnx(OnnxRuntime):
    """A plugin whose load never returns until released: a driver stuck in an ioctl."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def load(self, request):
        self.release.wait(30)
        return super().load(request)


def test_a_hung_load_is_abandoned_after_the_probe_timeout(tmp_path, package, monkeypatch):
    hung = _HungOnnx()
    monkeypatch.setitem(runtimes._loaded, "onnxruntime", hung)
    profile = load_profile(write_profile(tmp_path, "p", [f"{CPU}:fp32", "openvino:CPU:fp32"]))
    choice = Chooser(_prober(tmp_path / "s", timeout_s=0.3)).choose(profile, package)
    assert choice.chosen.key == "openvino:CPU:fp32"
    assert "no answer within probe_timeout_s = 0.3 s" in choice.results[f"{CPU}:fp32"].error
    hung.release.set()  # the abandoned thread finishes and closes what it loaded
    choice.session.close()


def test_probe_cache_keeps_only_the_newest_entries(tmp_path: Path) -> None:
    cache = ProbeCache(tmp_path / CACHE_FILE, max_entries=3)
    for i in range(5):
        cache.put_probe(f"k{i}", ProbeResult(f"c{i}", False, "no", at=float(i)))
    reread = ProbeCache(tmp_path / CACHE_FILE, max_entries=3)
    assert [reread.get_probe(f"k{i}") is not None for i in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]


def test_unwritable_state_directory_only_costs_the_cache(tmp_path: Path, package, caplog) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")
    profile = load_profile(write_profile(tmp_path, "p", [f"{CPU}:fp32"]))
    choice = Chooser(_prober(blocker / "sub")).choose(profile, package)
    assert choice.chosen is not None
    assert "cannot write probe cache" in caplog.text
    choice.session.close()


def test_garbled_cache_entries_are_probed_again(tmp_path: Path, package) -> None:
    state = tmp_path / "state"
    profile = load_profile(write_profile(tmp_path, "p", ["openvino:NPU:fp32", f"{CPU}:fp32"]))
    Chooser(_prober(state)).choose(profile, package).session.close()
    path = state / CACHE_FILE
    data = json.loads(path.read_text())
    for entry in data["probes"].values():
        entry["at"] = "yesterday"
    data["probes"]["junk"] = ["not", "a", "table"]
    path.write_text(json.dumps(data))
    choice = Chooser(_prober(state)).choose(profile, package)
    assert not choice.results["openvino:NPU:fp32"].cached
    assert choice.chosen.key == f"{CPU}:fp32"
    choice.session.close()
