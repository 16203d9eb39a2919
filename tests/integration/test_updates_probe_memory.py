"""Devices remember failed accelerator probes across models and versions (issue 23): a new
release never fetches a variant for an accelerator that already failed here, and the memory
is the probe cache in the state directory, so it survives a restart and a model not loaded.

The faithful fake: profile generic-x86_64 ranks onnxruntime/CUDAExecutionProvider first,
and this machine's onnxruntime has no CUDA, so that probe really fails."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from edgeagent.hardware.choose import release_variants
from edgeagent.hardware.probe import CACHE_FILE, ProbeResult
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.package import load_package
from edgeagent.runtimes import installed_version
from tests.integration.test_release_v2 import _three_variant_package
from tests.integration.test_updates_helpers import Hub, hub_fixture, make_device  # noqa: F401

CUDA_FP16 = "onnxruntime:CUDAExecutionProvider:fp16"
CUDA_FP32 = "onnxruntime:CUDAExecutionProvider:fp32"
MEMORY_S = 3600.0
SETTINGS = HardwareSettings(profile="generic-x86_64")


async def _probe_once(state: Path, package: Path) -> None:
    """Serve ``package`` once (its CUDA probes fail and are cached), then stop serving it."""
    accelerators = Accelerators(SETTINGS, state)
    session = await asyncio.to_thread(accelerators.open, load_package(package))
    session.close()
    assert accelerators.failed_candidates() == set()  # nothing served: the old memory is empty


async def test_a_new_release_never_fetches_a_variant_whose_accelerator_failed_here(
    hub: Hub, tmp_path: Path
) -> None:
    await _probe_once(tmp_path / "hw", _three_variant_package(hub, "1"))
    restarted = Accelerators(SETTINGS, tmp_path / "hw")  # a restart: only the state dir knows
    assert CUDA_FP16 in restarted.failed_candidates(MEMORY_S)

    with ThreadPoolExecutor(2) as executor:
        device = make_device(tmp_path / "device", hub.keys / "trust.json", executor)
        device.updater.choose_variants = lambda available: release_variants(
            restarted.profile, available, failed=restarted.failed_candidates(MEMORY_S)
        )
        try:
            outcome = await device.apply(hub.sign(_three_variant_package(hub, "2")))
            assert (outcome["result"], outcome["code"]) == ("succeeded", "committed"), outcome
        finally:
            await device.registry.close()
    downloaded = next(e for e in device.events if e.get("step") == "downloaded")
    assert downloaded["variants"] == ["onnxruntime/fp32"]  # not the CUDA fp16 one
    needed = ["tiny-2.tar.gz", "tiny-2.onnxruntime.fp32.tar.gz"]
    assert downloaded["bytes"] == sum((hub.artifacts / n).stat().st_size for n in needed)


async def test_a_new_runtime_version_or_an_old_failure_is_probed_again(
    hub: Hub, tmp_path: Path
) -> None:
    await _probe_once(tmp_path / "hw", _three_variant_package(hub, "1"))
    cache = tmp_path / "hw" / CACHE_FILE
    data = json.loads(cache.read_text())
    stages = {e["candidate"]: e["stage"] for e in data["probes"].values() if not e["ok"]}
    assert stages[CUDA_FP16] == "load"  # the device's own failure, not the model's
    assert CUDA_FP16 in Accelerators(SETTINGS, tmp_path / "hw").failed_candidates(MEMORY_S)

    assert Accelerators(SETTINGS, tmp_path / "hw").failed_candidates(0) == set()  # off
    for entry in data["probes"].values():
        entry["at"] -= 2 * MEMORY_S  # older than the memory
    cache.write_text(json.dumps(data))
    assert Accelerators(SETTINGS, tmp_path / "hw").failed_candidates(MEMORY_S) == set()
    for entry in data["probes"].values():
        entry["at"] += 2 * MEMORY_S
        entry["runtime_version"] = "0.0.1"  # learnt on another onnxruntime
    cache.write_text(json.dumps(data))
    assert Accelerators(SETTINGS, tmp_path / "hw").failed_candidates(MEMORY_S) == set()


def test_only_an_accelerators_own_failure_is_remembered(tmp_path: Path) -> None:
    """Wrong answers are the variant's fault and a CPU candidate works wherever its runtime
    does: neither keeps a variant out; a later success of the candidate forgets a failure."""
    accelerators = Accelerators(SETTINGS, tmp_path)
    version, now = installed_version("onnxruntime"), time.time()
    put = accelerators.prober.cache.put_probe

    def failure(candidate: str, stage: str, at: float = now) -> ProbeResult:
        return ProbeResult(candidate, False, "it failed", runtime_version=version, at=at,
                           stage=stage)  # fmt: skip

    put("m1|a", failure(CUDA_FP16, "answers"))
    put("m1|b", failure("onnxruntime:CPUExecutionProvider:fp32", "load"))
    assert accelerators.failed_candidates(MEMORY_S) == set()
    put("m1|c", failure(CUDA_FP32, "run"))
    assert accelerators.failed_candidates(MEMORY_S) == {CUDA_FP32}
    put("m2|c", ProbeResult(CUDA_FP32, True, runtime_version=version, at=now + 1))
    assert accelerators.failed_candidates(MEMORY_S) == set()
