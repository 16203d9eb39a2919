"""The packager's decisions: which variants stay, INT8 weight range, labelled image folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgeagent.models.package import Preprocess
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.images import load_samples
from edgeagent.packaging.quantize import cpu_has_vnni
from edgeagent.packaging.validate import VariantReport, compare, judge


def _report(agreement: float | None) -> VariantReport:
    """A measured variant (judge leaves alone one that never ran: it has no errors)."""
    report = VariantReport("onnxruntime", "int8", "cpu", "test")
    report.top1_agreement = agreement
    report.max_abs_error, report.cosine_min = 0.1, 0.999
    return report


def test_a_variant_beyond_the_top1_tolerance_is_left_out_with_the_reason() -> None:
    inside, outside, tensor = _report(99.0), _report(98.5), _report(None)
    judge([inside, outside, tensor], max_top1_drop=1.0)
    assert inside.kept and tensor.kept
    assert not outside.kept
    assert outside.reason == (
        "top-1 agreement 98.50 % is 1.50 points below fp32 (--max-top1-drop 1)"
    )


def test_compare_reports_errors_agreement_recall_and_accuracy() -> None:
    reference = {"y": np.array([[3.0, 1, 0, 0, 0, 0], [0, 3.0, 1, 0, 0, 0]], np.float32)}
    variant = {"y": np.array([[1.0, 3, 0, 0, 0, 0], [0, 3.0, 1, 0, 0, 0]], np.float32)}
    report = _report(None)
    compare(report, reference, variant, classifier=True, labels=np.array([1, 1]))
    assert report.top1_agreement == 50.0
    assert report.top5_recall == 100.0
    assert report.accuracy == 100.0
    assert report.max_abs_error == pytest.approx(2.0)
    assert report.cosine_min == pytest.approx(0.6)
    silent = {"y": np.zeros((2, 6), np.float32)}  # a segmentation map with nothing in it
    compare(report, silent, silent, classifier=False, labels=None)
    assert report.cosine_min == 1.0 and report.max_abs_error == 0.0


@pytest.mark.parametrize(
    ("flags", "vnni"),
    [
        ("fpu sse2 avx2 fma", False),  # the AMD EPYC packaging machine: U8S8 can saturate
        ("fpu avx2 avx512f avx512_vnni", True),
        ("fpu avx2 avx_vnni", True),
        ("fp asimd asimddp", True),  # ARM: not x86's VPMADDUBSW
    ],
)
def test_vnni_decides_reduce_range(tmp_path: Path, flags: str, vnni: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert cpu_has_vnni(cpuinfo) is vnni


def _spec() -> Preprocess:
    return Preprocess((4, 4), None, "NCHW", "L", 1 / 255, (0.0,), (1.0,))


def test_image_folder_dirs_give_labels_by_name(tmp_path: Path) -> None:
    for label, value in (("cat", 10), ("dog", 200)):
        (tmp_path / label).mkdir()
        Image.new("L", (4, 4), value).save(tmp_path / label / "a.png")
    samples = load_samples(tmp_path, _spec(), "--heldout", 10, ("dog", "cat"), (-1, 1, 4, 4))
    assert samples.labels is not None and samples.labels.tolist() == [1, 0]  # cat, dog
    np.testing.assert_allclose(samples.inputs[:, 0, 0, 0], [10 / 255, 200 / 255], rtol=1e-6)


def test_tensors_of_another_shape_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "calibration.npz"
    np.savez(data, inputs=np.zeros((2, 3, 5, 5), np.float32))
    with pytest.raises(
        PackagingError, match=r"calibration.npz: inputs of shape \[3, 5, 5\] do not"
    ):
        load_samples(data, None, "--calibration", 10, (), (-1, 1, 4, 4))
    nchw = tmp_path / "nchw.npz"
    np.savez(nchw, inputs=np.zeros((2, 1, 4, 6), np.float32))
    assert load_samples(nchw, None, "--calibration", 10, (), (-1, 4, 6, 1)).inputs.shape == (
        2,
        4,
        6,
        1,
    )


def test_a_folder_without_images_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PackagingError, match="no .jpg/.jpeg/.png images in it"):
        load_samples(tmp_path, _spec(), "--calibration", 10, (), (-1, 1, 4, 4))
