"""The lone request's session (issue 28): beside a plan of 1-thread instances, the hardware
façade keeps one session of all the cores, which a request alone on the idle device runs on and
status shows; it is not kept when turned off, nor beside a pinned thread count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeagent.hardware.instances import InstanceGroup
from edgeagent.hardware.plan_search import PlanRequest
from edgeagent.models.package import load_package
from tests.support.hardware import board_accelerators
from tests.support.helpers import write_tiny_package


@pytest.fixture
def opened(tmp_path: Path):
    accelerators = board_accelerators(
        tmp_path, ["onnxruntime:CPUExecutionProvider:fp32"], threads=2
    )
    package = load_package(write_tiny_package(tmp_path / "tiny"))
    groups: list[InstanceGroup] = []

    def open_with(**request) -> InstanceGroup:
        group = accelerators.open(package, PlanRequest(search_s=0.3, **request))
        assert isinstance(group, InstanceGroup)
        groups.append(group)
        return group

    yield open_with
    for group in groups:
        group.close()


def test_a_lone_request_runs_on_the_session_of_all_the_cores(opened) -> None:
    group = opened(instances=2)  # 2 instances of 1 thread on 2 cores
    assert group.plan.shape.threads == 1 and group.lone is not None
    x = np.ones((1, 3, 8, 8), np.float32)
    group.run({"input": x})
    status = group.status()
    assert status["lone"]["batches"] == 1 and status["lone"]["device"] == group.lanes[0].device
    assert sum(i["batches"] for i in status["instances"]) == 0
    group.run({"input": np.ones((3, 3, 8, 8), np.float32)})  # more than one row: an instance
    assert sum(i["batches"] for i in group.status()["instances"]) == 1


@pytest.mark.parametrize("request_", [{"instances": 2, "lone": False}, {"threads": 1}])
def test_no_lone_session_when_turned_off_or_beside_pinned_threads(opened, request_) -> None:
    group = opened(**request_)
    assert group.lone is None and "lone" not in group.status()
