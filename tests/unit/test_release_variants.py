"""Release format 2 on the device, as units: which variants a device downloads (the profile's
ranking before anything can be probed) and loading a package that holds only some of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.hardware.choose import release_variants
from edgeagent.hardware.profile import load_profiles
from edgeagent.models.package import INSTALLED_VARIANTS, PackageError, load_package
from tests.support.helpers import write_tiny_package

GENERIC = next(p for p in load_profiles() if p.name == "generic-x86_64")


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
    assert release_variants(GENERIC, offered, cpu_fallback=fallback) == expected


def test_candidates_whose_probe_failed_here_are_skipped() -> None:
    offered = ["onnxruntime/fp32", "litert/int8"]
    failed = {"onnxruntime:CUDAExecutionProvider:fp32"}
    assert release_variants(GENERIC, offered, failed=failed) == ["litert/int8"]


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
