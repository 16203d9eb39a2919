"""Finding the packages of a models directory: what is listed, and a directory that is not one."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.models.locate import find_packages
from edgeagent.models.package import PackageError
from tests.support.helpers import write_tiny_package


def test_only_directories_with_a_model_toml_are_packages(tmp_path: Path) -> None:
    write_tiny_package(tmp_path / "b")
    write_tiny_package(tmp_path / "a", name="alpha")
    (tmp_path / "notes").mkdir()
    (tmp_path / "README").write_text("not a package")
    assert find_packages(tmp_path) == {"a": tmp_path / "a", "b": tmp_path / "b"}


def test_a_missing_directory_or_a_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match=f"models directory {tmp_path / 'x'} does not exist"):
        find_packages(tmp_path / "x")
    (tmp_path / "file").write_text("")
    with pytest.raises(PackageError, match="is not a directory"):
        find_packages(tmp_path / "file")


def test_a_models_directory_that_is_a_package_is_that_one_package(tmp_path: Path) -> None:
    """KServe's storage initializer puts one model's files straight into /mnt/models."""
    write_tiny_package(tmp_path / "models")
    write_tiny_package(tmp_path / "models" / "nested")  # inside a package: not another one
    assert find_packages(tmp_path / "models") == {"models": tmp_path / "models"}
