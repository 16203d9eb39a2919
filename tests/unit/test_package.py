"""model.toml validation: good packages load, every kind of broken package names its problem."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgeagent.models.package import PackageError, load_package, version_tuple


def _edit(package: Path, old: str, new: str) -> None:
    manifest = package / "model.toml"
    text = manifest.read_text()
    assert old in text, f"fixture no longer contains {old!r}"
    manifest.write_text(text.replace(old, new))


def test_valid_package_loads_with_all_fields(tiny_package: Path) -> None:
    package = load_package(tiny_package)
    assert package.name == "tiny"
    assert package.version == "1"
    assert package.inputs[0].shape == (-1, 3, 8, 8)
    assert package.labels == ("class_0", "class_1", "class_2", "class_3")
    assert package.preprocess is not None and package.preprocess.size == (8, 8)
    assert package.serving.max_batch_size == 4
    variant = package.variant("onnxruntime", "fp32")
    assert variant is not None and variant.files[0].name == "tiny.fp32.onnx"
    assert package.variant("litert", "int8") is None
    assert re.fullmatch(r"[0-9a-f]{64}", package.content_hash())


def test_content_hash_changes_with_model_bytes(tiny_package: Path) -> None:
    before = load_package(tiny_package).content_hash()
    _edit(tiny_package, "sha256 = {", "# sha256 = {")
    model = tiny_package / "tiny.fp32.onnx"
    model.write_bytes(model.read_bytes() + b"\0")
    assert load_package(tiny_package).content_hash() != before


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('name = "tiny"', 'name = "../evil"', "name: must be"),
        ('version = "1"', 'version = "one"', "version: 'one' is not"),
        ('version = "1"', 'version = "1\\n"', "version: '1\\n' is not"),
        ('version = "1"', 'version = "\\u0661"', "version: '\u0661' is not"),
        ('version = "1"', "version = 10000000000000", "version: '10000000000000' is not"),
        ('name = "tiny"', 'name = "tiny\\n"', "name: must be"),
        ('runtime = "onnxruntime"', 'runtime = "tensorflow"', "variant[0].runtime: 'tensorflow'"),
        ('precision = "fp32"', 'precision = "int4"', "variant[0].precision"),
        ('dtype = "float32"', 'dtype = "complex64"', "inputs[0].dtype"),
        ("shape = [-1, 3, 8, 8]", 'shape = [-1, "x"]', "inputs[0].shape"),
        ("shape = [-1, 4]", "shape = [-1, 5]", "labels.txt has 4 labels but output"),
        ("shape = [-1, 4]", "shape = []", "output 'logits' is a scalar: labels need a class"),
        ('labels = "labels.txt"', 'labels = "nope.txt"', "labels: file 'nope.txt' does not exist"),
        ('labels = "labels.txt"', 'labels = "../../etc/passwd"', "points outside the package"),
        ("size = [8, 8]", "size = [8]", "preprocess.size"),
        ("std = [0.25, 0.25, 0.25]", "std = [0.25, 0, 0.25]", "preprocess.std: must not contain 0"),
        ("max_batch_size = 4", "max_batch_size = 0", "serving.max_batch_size"),
        (
            'task = "classification"',
            'task = "classification"\ncolour = 1',
            "unknown field(s) colour",
        ),
    ],
)
def test_invalid_field_is_named(tiny_package: Path, old: str, new: str, message: str) -> None:
    _edit(tiny_package, old, new)
    with pytest.raises(PackageError, match=re.escape(message)):
        load_package(tiny_package)


def test_missing_model_file_is_named(tiny_package: Path) -> None:
    (tiny_package / "tiny.fp32.onnx").unlink()
    with pytest.raises(PackageError, match=r"variant\[0\]\.files: file 'tiny.fp32.onnx' does not"):
        load_package(tiny_package)


def test_corrupt_model_bytes_fail_the_checksum(tiny_package: Path) -> None:
    model = tiny_package / "tiny.fp32.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="does not match its SHA-256"):
        load_package(tiny_package)


@pytest.mark.parametrize(
    ("runtime", "error"),
    [
        ("litert", r"is not a litert file \(\.tflite\)"),
        ("llama_cpp", r"variant\[0\].runtime: llama_cpp runs a language model, not this"),
    ],
)
def test_wrong_file_kind_for_runtime(tiny_package: Path, runtime: str, error: str) -> None:
    _edit(tiny_package, 'runtime = "onnxruntime"', f'runtime = "{runtime}"')
    with pytest.raises(PackageError, match=error):
        load_package(tiny_package)


def test_bad_toml_and_missing_manifest(tiny_package: Path, tmp_path: Path) -> None:
    (tiny_package / "model.toml").write_text("name = [unclosed")
    with pytest.raises(PackageError, match="not valid TOML"):
        load_package(tiny_package)
    with pytest.raises(PackageError, match=r"model\.toml is missing"):
        load_package(tmp_path)
    with pytest.raises(PackageError, match="not a model package directory"):
        load_package(tmp_path / "absent")


def test_duplicate_variant_is_refused(tiny_package: Path) -> None:
    text = (tiny_package / "model.toml").read_text()
    variant = text[text.index("[[variant]]") :]
    (tiny_package / "model.toml").write_text(text + "\n" + variant)
    with pytest.raises(PackageError, match="onnxruntime/fp32 is declared twice"):
        load_package(tiny_package)


def test_versions_order_numerically() -> None:
    assert version_tuple("1.10.0") > version_tuple("1.9.9")
    assert version_tuple("3") == version_tuple("3.0.0")
    assert version_tuple("2") > version_tuple("1.99")
