"""The update health check and the probe follow the package's task, not only classifiers'.

A tensor-task package's golden file holds reference outputs and a tolerance; answers within it
pass, answers outside it fail with the output named — through the same ``health_check`` the
updater runs and the same ``golden_problem`` the probe runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devtools.package import add_field, set_fields
from edgeagent.hardware.probe import golden_problem
from edgeagent.models.package import ModelPackage, load_package
from edgeagent.models.session import open_variant
from edgeagent.models.tasks import golden_record
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.health import health_check
from tests.support.helpers import write_tiny_package


def tensor_package(root: Path) -> ModelPackage:
    """The tiny model as a ``tensor`` task, its golden file made from its own fp32 answers."""
    write_tiny_package(root)
    inputs = np.random.default_rng(5).standard_normal((3, 3, 8, 8)).astype(np.float32)
    session = open_variant(load_package(root), threads=1)
    try:
        reference = session.run({"input": inputs})
    finally:
        session.close()
    record = golden_record("tensor", ["logits"], reference, atol=1e-4, rtol=1e-3)
    np.savez(root / "golden.npz", inputs=inputs, **record)
    set_fields(root, {"task": "tensor"})
    add_field(root, "golden", "golden.npz")
    return load_package(root)


class Answering:
    """A served model that answers with the real session, optionally shifted by ``error``."""

    def __init__(self, package: ModelPackage, error: float = 0.0) -> None:
        self.package = package
        self.error = error
        self._session = open_variant(package, threads=1)

    async def infer(self, feeds: dict[str, np.ndarray], **_: Any) -> dict[str, np.ndarray]:
        return {k: v + self.error for k, v in self._session.run(feeds).items()}

    def close(self) -> None:
        self._session.close()


@pytest.fixture
def package(tmp_path: Path) -> ModelPackage:
    return tensor_package(tmp_path / "tiny")


async def test_a_tensor_model_within_its_tolerance_passes(package: ModelPackage) -> None:
    model = Answering(package)
    try:
        await health_check(model, timeout_s=10)  # type: ignore[arg-type]
    finally:
        model.close()


async def test_a_tensor_model_outside_its_tolerance_fails_naming_the_output(package) -> None:
    model = Answering(package, error=0.05)
    try:
        with pytest.raises(InstallFailed) as caught:
            await health_check(model, timeout_s=10)  # type: ignore[arg-type]
    finally:
        model.close()
    assert caught.value.code == "health_check_failed"
    assert "output 'logits'" in str(caught.value) and "tolerance" in str(caught.value)


def test_the_probe_holds_a_tensor_model_to_its_golden_outputs(package: ModelPackage) -> None:
    session = open_variant(package, threads=1)
    try:
        assert golden_problem(package, session, min_agreement=1.0) == ""
    finally:
        session.close()
    reference = dict(np.load(package.golden))
    np.savez(package.golden, **{**reference, "expected_0": reference["expected_0"] + 1.0})
    session = open_variant(package, threads=1)
    try:
        assert "wrong answers" in golden_problem(package, session, min_agreement=1.0)
    finally:
        session.close()
