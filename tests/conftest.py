"""Fixtures every test may use: a tiny real model package, and the built zoo."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import write_tiny_package, zoo_dir


@pytest.fixture
def tiny_package(tmp_path: Path) -> Path:
    return write_tiny_package(tmp_path / "tiny")


@pytest.fixture(scope="session")
def zoo() -> Path:
    """The zoo built by scripts/build_models.py; the test command builds it before pytest."""
    path = zoo_dir()
    if not (path / "mobilenet_v2" / "model.toml").is_file():
        pytest.fail(f"model zoo not found at {path}: run scripts/setup.sh (it builds the zoo)")
    return path
