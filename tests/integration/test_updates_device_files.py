"""Bytes per device (issue 23): a device downloads its variant and the files it needs, and
no more — measured on the zoo's detector, whose held-out data used to be 21× its INT8
variant — and it validates what it gets as a package: a shared archive missing a declared
device file is refused."""

from __future__ import annotations

import asyncio
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from devtools.package import add_field
from edgeagent.hardware.choose import release_variants
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.hub.sign import archive_package, device_needs
from edgeagent.models.package import load_package
from tests.integration.test_updates_helpers import (  # noqa: F401 - fixture
    Hub,
    add_golden,
    device_fixture,
    hostile_archive,
    hub_fixture,
    make_device,
)

DETECTOR = "shapes_grid_mnv2"
GOAL = 1.05  # bytes per device / (its variant + the files it needs)
MEMORY_S = 3600.0


def needed_bytes(root: Path, variant_key: str) -> int:
    """The raw size of what a device running ``variant_key`` needs from the package."""
    return sum(p.stat().st_size for p in device_needs(load_package(root), [variant_key]))


def test_every_variant_of_the_zoo_detector_meets_the_bytes_goal(zoo: Path, tmp_path: Path) -> None:
    root = zoo / DETECTOR
    archives = archive_package(root, tmp_path)
    with tarfile.open(archives.shared.path) as shared:
        assert sorted(shared.getnames()) == ["golden.npz", "labels.txt", "model.toml"]
    for key, archive in archives.variants.items():
        ratio = (archives.shared.size + archive.size) / needed_bytes(root, key)
        assert ratio <= GOAL, f"{key}: {ratio:.3f}"


async def test_a_device_downloads_only_what_it_runs_of_the_zoo_detector(
    zoo: Path, hub: Hub, tmp_path: Path
) -> None:
    """The real path: probes on this machine (profile generic-x86_64: CUDA, NPU and Edge TPU
    fail, remembered), the release signed by the hub, downloaded, installed, golden-checked."""
    root = zoo / DETECTOR
    settings = HardwareSettings(profile="generic-x86_64")
    accelerators = Accelerators(settings, tmp_path / "hw")
    (await asyncio.to_thread(accelerators.open, load_package(root))).close()
    with ThreadPoolExecutor(2) as executor:
        device = make_device(tmp_path / "device", hub.keys / "trust.json", executor)
        device.updater.choose_variants = lambda available: release_variants(
            accelerators.profile, available, failed=accelerators.failed_candidates(MEMORY_S)
        )
        try:
            outcome = await device.apply(hub.sign(root))
            assert (outcome["result"], outcome["code"]) == ("succeeded", "committed"), outcome
            installed = device.store.current_dir(DETECTOR)
            assert installed is not None and not (installed / "heldout.npz").exists()
        finally:
            await device.registry.close()
    downloaded = next(e for e in device.events if e.get("step") == "downloaded")
    (variant,) = downloaded["variants"]
    ratio = downloaded["bytes"] / needed_bytes(root, variant)
    assert ratio <= GOAL, f"{variant}: {downloaded['bytes']} bytes, {ratio:.3f}"


async def test_a_shared_archive_missing_a_declared_file_is_refused(hub: Hub, device) -> None:
    root = add_golden(hub.package("1"))
    (root / "notes.txt").write_text("the device needs this\n")
    add_field(root, "device_files", ["labels.txt", "golden.npz", "notes.txt"])
    archives = archive_package(root, root.parent)
    names = ["model.toml", "labels.txt", "golden.npz"]  # notes.txt left out
    shared = hostile_archive([(n, (root / n).read_bytes()) for n in names])
    variant = archives.variants["onnxruntime/fp32"].path.read_bytes()
    release = hub.raw_release(shared, version="1", variant_bytes=variant)
    outcome = await device.apply(release)
    assert (outcome["result"], outcome["code"]) == ("refused", "bad_package"), outcome
    assert "device_files: file 'notes.txt' does not exist" in outcome["message"]
    assert device.store.current("tiny") is None and device.store.bad_versions("tiny") == {"1"}
