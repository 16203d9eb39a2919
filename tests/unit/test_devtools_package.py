"""devtools.package: a model.toml edit that cannot apply fails loudly instead of doing nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.package import add_field, keep_variants, rehash_files, set_fields
from edgeagent.models.package import load_package


def test_set_fields_changes_named_fields_and_keeps_a_valid_package(tiny_package: Path) -> None:
    set_fields(
        tiny_package, {"version": "2", "serving.max_batch_size": 8, "inputs.0.layout": "NCHW"}
    )
    package = load_package(tiny_package)
    assert (package.version, package.serving.max_batch_size) == ("2", 8)


@pytest.mark.parametrize("path", ["versoin", "serving.max_batch", "inputs.3.shape"])
def test_set_fields_refuses_a_field_that_does_not_exist(tiny_package: Path, path: str) -> None:
    before = (tiny_package / "model.toml").read_text()
    with pytest.raises((KeyError, IndexError)):
        set_fields(tiny_package, {path: 1})
    assert (tiny_package / "model.toml").read_text() == before


def test_add_field_refuses_a_field_that_exists(tiny_package: Path) -> None:
    with pytest.raises(KeyError, match="already has 'labels'"):
        add_field(tiny_package, "labels", "other.txt")


def test_keep_variants_refuses_to_leave_none(tiny_package: Path) -> None:
    with pytest.raises(KeyError, match="no variant"):
        keep_variants(tiny_package, lambda variant: variant["precision"] == "int8")


def test_rehash_files_records_the_new_digest(tiny_package: Path) -> None:
    model = tiny_package / "tiny.fp32.onnx"
    model.write_bytes(model.read_bytes() + b"\0")
    rehash_files(tiny_package)
    load_package(tiny_package)  # raises on a SHA-256 mismatch
