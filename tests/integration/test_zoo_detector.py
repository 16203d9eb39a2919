"""The zoo's trained detector through the agent's own sessions, decoder and health checks.

Needs the built zoo (``scripts/build_models.py``), found via ``EDGEAGENT_ZOO``; a zoo without
the detector is a failure, as for the other zoo packages. Every variant is fed the held-out
scenes the way the daemon feeds an uploaded image (PNG → preprocessing → session → the
package's ``[detection]`` head), so the mAP checked here is the served model's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devtools.detection_scenes import HeldOut, load_heldout
from edgeagent.hardware.probe import golden_problem
from edgeagent.models.detector import decode_batch
from edgeagent.models.package import ModelPackage, load_package
from edgeagent.models.preprocess import prepare_image
from edgeagent.models.session import open_variant
from edgeagent.models.tasks.detection_map import mean_average_precision
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.health import health_check
from tests.integration.test_zoo import PRECISIONS, RUNTIMES, ZOO, zoo_package

NAME = "shapes_grid_mnv2"
MIN_FP32_MAP = 0.85  # it is really trained: 0.946 measured at build time
MAX_INT8_LOSS_POINTS = 2.0  # INT8 within 2 mAP points of FP32 on every runtime
VARIANTS = [(r, p) for r in RUNTIMES for p in PRECISIONS]


@pytest.fixture(scope="module")
def package() -> ModelPackage:
    return zoo_package(NAME)


@pytest.fixture(scope="module")
def heldout(package: ModelPackage) -> tuple[HeldOut, np.ndarray]:
    """The held-out scenes and their tensors, made from PNG bytes by the agent's preprocessing."""
    scenes = load_heldout(ZOO / NAME)
    assert package.preprocess is not None
    tensors = [
        prepare_image(scenes.png(i), package.preprocess)[0] for i in range(len(scenes.images))
    ]
    return scenes, np.concatenate(tensors)


def served_map(package: ModelPackage, runtime: str, precision: str, heldout) -> float:
    scenes, inputs = heldout
    session = open_variant(package, runtime, precision, threads=1)
    try:
        name = package.inputs[0].name
        rows = [session.run({name: inputs[i : i + 1]}) for i in range(len(inputs))]
    finally:
        session.close()
    found = [decode_batch(package, answer)[0] for answer in rows]
    return mean_average_precision(found, scenes.boxes, scenes.labels, len(package.labels))


@pytest.fixture(scope="module")
def maps(package: ModelPackage, heldout) -> dict[tuple[str, str], float]:
    return {v: served_map(package, *v, heldout) for v in VARIANTS}


def test_the_detector_package_is_complete(package: ModelPackage) -> None:
    assert package.task == "detection" and package.detection is not None
    assert package.labels == ("ellipse", "rectangle", "triangle", "cross")
    assert {(v.runtime, v.precision) for v in package.variants} == set(VARIANTS)
    for extra in ("golden.npz", "heldout.npz", "accuracy.json", "evaluation.json"):
        assert (ZOO / NAME / extra).is_file(), extra


@pytest.mark.parametrize(("runtime", "precision"), VARIANTS)
def test_every_variant_finds_the_objects_of_held_out_scenes(maps, runtime, precision) -> None:
    assert maps[(runtime, "fp32")] >= MIN_FP32_MAP
    loss = 100 * (maps[(runtime, "fp32")] - maps[(runtime, precision)])
    assert loss <= MAX_INT8_LOSS_POINTS, f"{runtime} {precision}: {loss:.2f} mAP points lost"


def test_the_recorded_map_is_what_the_agent_measures(maps) -> None:
    """accuracy.json was measured by the build with the raw runtimes on the raw scenes; the
    agent's sessions on the PNG-decoded scenes must reproduce it."""
    recorded = json.loads((ZOO / NAME / "accuracy.json").read_text())["map"]
    for (runtime, precision), value in maps.items():
        assert value == pytest.approx(recorded[runtime][precision], abs=0.01), (runtime, precision)


class Served:
    """What the updater's health check talks to: a model answering with one real session."""

    def __init__(self, package: ModelPackage, runtime: str, precision: str) -> None:
        self.package = package
        self._session = open_variant(package, runtime, precision, threads=1)

    async def infer(self, feeds: dict[str, np.ndarray], **_: Any) -> dict[str, np.ndarray]:
        return self._session.run(feeds)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *_: object) -> None:
        self._session.close()


@pytest.mark.parametrize(("runtime", "precision"), VARIANTS)
async def test_every_variant_passes_the_probe_and_the_update_health_check(
    package: ModelPackage, runtime: str, precision: str
) -> None:
    golden = dict(np.load(ZOO / NAME / "golden.npz"))
    assert len(golden["boxes"]) >= len(golden["inputs"])  # at least a box per golden scene
    session = open_variant(package, runtime, precision, threads=1)
    try:
        assert golden_problem(package, session, min_agreement=1.0) == ""
    finally:
        session.close()
    with Served(package, runtime, precision) as model:
        await health_check(model, timeout_s=30)  # type: ignore[arg-type]


async def test_a_golden_box_the_model_does_not_find_fails_the_health_check(
    tmp_path: Path,
) -> None:
    """Shift one golden box by half its width: the healthy model no longer matches it."""
    copy = tmp_path / NAME
    shutil.copytree(ZOO / NAME, copy)
    golden = dict(np.load(copy / "golden.npz"))
    shifted = golden["boxes"].copy()
    shifted[0, [0, 2]] += (shifted[0, 2] - shifted[0, 0]) / 2
    np.savez(copy / "golden.npz", **{**golden, "boxes": shifted})
    with (
        Served(load_package(copy), "onnxruntime", "fp32") as model,
        pytest.raises(InstallFailed, match="no class-.* box with IoU") as caught,
    ):
        await health_check(model, timeout_s=30)  # type: ignore[arg-type]
    assert caught.value.code == "health_check_failed"
