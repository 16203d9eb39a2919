"""A package declares the files devices need (``device_files``), and ``hub sign``'s shared
archive holds only those (issue 23): held-out and evaluation data stay on the hub. A package
without the declaration ships every non-variant file except the known hub-only ones."""

from __future__ import annotations

import dataclasses
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest

from devtools.package import add_field, read_model_toml
from devtools.tiny import tiny_manifest, write_tiny_onnx
from edgeagent.hub.sign import archive_package
from edgeagent.models.manifest_writer import VariantFiles, write_manifest
from edgeagent.models.package import PackageError, load_package
from tests.support.helpers import write_tiny_package


def _package(tmp_path: Path) -> Path:
    """The tiny package with golden inputs, the packager's hub-only files and an extra file."""
    root = write_tiny_package(tmp_path / "tiny")
    np.savez(root / "golden.npz", inputs=np.zeros((1, 3, 8, 8), np.float32), top1=np.zeros(1))
    add_field(root, "golden", "golden.npz")
    np.savez(root / "heldout.npz", inputs=np.zeros((64, 3, 8, 8), np.float32))
    (root / "validation.json").write_text("{}\n")
    (root / "evaluation.json").write_text("{}\n")
    (root / "notes.txt").write_text("read me\n")
    return root


def _shared(root: Path) -> list[str]:
    with tempfile.TemporaryDirectory() as work:
        archives = archive_package(root, Path(work))
        with tarfile.open(archives.shared.path) as archive:
            return sorted(archive.getnames())


def test_an_undeclared_package_never_ships_hub_only_files(tmp_path: Path) -> None:
    root = _package(tmp_path)
    assert load_package(root).device_files is None
    assert _shared(root) == ["golden.npz", "labels.txt", "model.toml", "notes.txt"]


def test_a_declared_package_ships_only_its_device_files(tmp_path: Path) -> None:
    root = _package(tmp_path)
    add_field(root, "device_files", ["labels.txt", "golden.npz"])
    assert _shared(root) == ["golden.npz", "labels.txt", "model.toml"]


@pytest.mark.parametrize(
    ("listed", "problem"),
    [
        (["labels.txt"], "the golden file 'golden.npz' is not listed"),
        (["golden.npz"], "the labels file 'labels.txt' is not listed"),
        (["labels.txt", "golden.npz", "gone.txt"], "file 'gone.txt' does not exist"),
        (["labels.txt", "golden.npz", "../x"], "points outside the package"),
        (["labels.txt", "golden.npz", 3], "entry 2 must be a file name"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_file(
    tmp_path: Path, listed: list, problem: str
) -> None:
    root = _package(tmp_path)
    add_field(root, "device_files", listed)
    with pytest.raises(PackageError, match="device_files") as info:
        load_package(root)
    assert problem in str(info.value)


def test_the_writer_declares_every_file_model_toml_names(tmp_path: Path) -> None:
    """What ``edgeagent package`` writes: labels and golden inputs added to the declaration."""
    root = tmp_path / "pkg"
    root.mkdir()
    write_tiny_onnx(root / "m.onnx")
    (root / "labels.txt").write_text("".join(f"c{i}\n" for i in range(4)))
    np.savez(root / "golden.npz", inputs=np.zeros((1, 3, 8, 8), np.float32), top1=np.zeros(1))
    manifest = dataclasses.replace(
        tiny_manifest("m", "1", 4, (VariantFiles("onnxruntime", "fp32", ("m.onnx",)),)),
        labels="labels.txt",
        golden="golden.npz",
        device_files=(),
    )
    package = write_manifest(root, manifest)
    assert read_model_toml(root)["device_files"] == ["labels.txt", "golden.npz"]
    assert package.device_files == (root / "labels.txt", root / "golden.npz")
