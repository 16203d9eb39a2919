"""Release format 2 on the device, as units: which variants a device downloads (the profile's
ranking before anything can be probed) and loading a package that holds only some of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.hardware.choose import device_listed, release_variants
from edgeagent.hardware.profile import load_profiles
from edgeagent.models.package import INSTALLED_VARIANTS, PackageError, load_package
from edgeagent.runtimes import get_runtime
from tests.support.helpers import write_tiny_package

GENERIC = next(p for p in load_profiles() if p.name == "generic-x86_64")
EVERY_DEVICE = lambda candidate: True  # noqa: E731 - a machine whose runtimes list them all


@pytest.mark.parametrize(
    ("offered", "fallback", "expected"),
    [
        # CUDA fp16 ranks first; its CPU fallback is the best CPU candidate offered.
        (["onnxruntime/fp32", "onnxruntime/fp16"], True, ["onnxruntime/fp16", "onnxruntime/fp32"]),
        (["onnxruntime/fp32", "onnxruntime/fp16"], False, ["onnxruntime/fp16"]),
        # The CUDA fp32 candidate and the CPU fp32 one need the same variant: one download.
        (["onnxruntime/fp32"], True, ["onnxruntime/fp32"]),
        (["litert/int8", "onnxruntime/fp32"], True, ["onnxruntime/fp32", "litert/int8"]),
        (["openvino/fp32"], True, ["openvino/fp32"]),  # a CPU candidate first: no fallback
        (["litert/fp16"], True, []),  # nothing this profile runs
    ],
)
def test_the_profile_ranking_picks_the_variants(offered, fallback, expected) -> None:
    """On a machine whose runtimes list every device of the profile."""
    chosen = release_variants(GENERIC, offered, cpu_fallback=fallback, listed=EVERY_DEVICE)
    assert chosen == expected


def test_candidates_whose_probe_failed_here_are_skipped() -> None:
    offered = ["onnxruntime/fp32", "litert/int8"]
    failed = {"onnxruntime:CUDAExecutionProvider:fp32"}
    chosen = release_variants(GENERIC, offered, failed=failed, listed=EVERY_DEVICE)
    assert chosen == ["litert/int8"]


def test_devices_the_runtimes_do_not_list_are_skipped_before_any_probe() -> None:
    """A first release, nothing probed yet: CUDA and the NPU are not listed by onnxruntime and
    OpenVINO here, so their variants are not fetched; the CPU's are, and only once."""
    offered = ["onnxruntime/fp16", "onnxruntime/fp32", "openvino/int8", "litert/int8"]
    listed = {"CUDAExecutionProvider": False, "NPU": False, "EDGETPU": False}
    chosen = release_variants(GENERIC, offered, listed=lambda c: listed.get(c.device, True))
    assert chosen == ["litert/int8"]  # the best CPU candidate offered; nothing to fall back to
    listed["CUDAExecutionProvider"] = True
    chosen = release_variants(GENERIC, offered, listed=lambda c: listed.get(c.device, True))
    assert chosen == ["onnxruntime/fp16", "litert/int8"]


def test_this_machines_runtimes_say_which_devices_they_list() -> None:
    """What device_listed reads: onnxruntime's providers, OpenVINO's devices (``GPU`` listed
    as ``GPU.0``; AUTO is a choice, not a device), LiteRT's CPU and its Edge TPU library."""
    onnx = get_runtime("onnxruntime")
    assert onnx.lists("CPU") and onnx.lists("CPUExecutionProvider")
    assert onnx.lists("CUDAExecutionProvider") == ("CUDAExecutionProvider" in onnx.devices())
    openvino = get_runtime("openvino")
    assert openvino.lists("CPU") and openvino.lists("AUTO") is None
    assert openvino.lists("NPU") == ("NPU" in openvino.devices())
    litert = get_runtime("litert")
    assert litert.lists("CPU") and litert.lists("DELEGATE") is None
    cpu = next(c for c in GENERIC.candidates if c.device == "CPU")
    assert device_listed(cpu)
    cuda = next(c for c in GENERIC.candidates if c.device == "CUDAExecutionProvider")
    assert device_listed(cuda) == ("CUDAExecutionProvider" in onnx.devices())


def test_openvino_lists_a_numbered_gpu_under_its_name(monkeypatch) -> None:
    openvino = get_runtime("openvino")
    monkeypatch.setattr(openvino, "devices", lambda: ["CPU", "GPU.0", "GPU.1"])
    assert openvino.lists("GPU") and openvino.lists("GPU.1") and openvino.lists("NPU") is False


def test_a_package_lists_only_its_installed_variants(tmp_path: Path) -> None:
    root = write_tiny_package(tmp_path / "tiny")
    with (root / "model.toml").open("a") as toml:
        toml.write('\n[[variant]]\nruntime = "litert"\nprecision = "int8"\nfiles = ["t.tflite"]\n')
    with pytest.raises(PackageError, match="t.tflite"):
        load_package(root)  # without the listing every variant's files must be there
    (root / INSTALLED_VARIANTS).write_text("onnxruntime/fp32\n")
    assert [v.key for v in load_package(root).variants] == ["onnxruntime/fp32"]


@pytest.mark.parametrize("listing", ["", "onnxruntime/int8\n"])
def test_a_listing_of_no_or_unknown_variants_is_refused(tmp_path: Path, listing: str) -> None:
    root = write_tiny_package(tmp_path / "tiny")
    (root / INSTALLED_VARIANTS).write_text(listing)
    with pytest.raises(PackageError, match=INSTALLED_VARIANTS):
        load_package(root)
