"""Hardware-test helpers: profiles written to disk, multi-variant packages, a flaky plugin.

The flaky plugin is the real onnxruntime plugin whose sessions, after a number of good runs,
hand onnxruntime a tensor of the wrong shape: the failure is onnxruntime's own error raised
through the plugin's own InferenceError, exactly what a session on a dying device produces.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from devtools.package import read_model_toml, write_model_toml
from devtools.tiny import tiny_manifest
from edgeagent import runtimes
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.manifest_writer import VariantFiles, write_manifest
from edgeagent.runtimes.onnx import OnnxRuntime, OnnxSession
from tests.support.helpers import write_tiny_package

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "boards"


def write_profile(directory: Path, name: str, candidates: list[str], **top: object) -> Path:
    """A generic profile whose candidates are "runtime:device:precision[:low]" strings."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f'name = "{name}"', 'arch = "any"', "generic = true"]
    lines += [f"{key} = {value}" for key, value in top.items()]
    for spec in candidates:
        runtime, device, precision, *power = spec.split(":")
        lines += [
            "[[candidate]]",
            f'runtime = "{runtime}"',
            f'device = "{device}"',
            f'precision = "{precision}"',
            f'power = "{power[0] if power else "high"}"',
        ]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def board_accelerators(
    tmp_path: Path, candidates: list[str], *, on_demote=None, **settings: object
) -> Accelerators:
    """The hardware façade on a generic x86 board whose one profile, "test", lists
    ``candidates``; ``settings`` are further HardwareSettings, the state under ``tmp_path``."""
    write_profile(tmp_path / "profiles", "test", candidates)
    return Accelerators(
        HardwareSettings(
            root=FIXTURES / "generic-x86_64",
            profiles_dir=tmp_path / "profiles",
            profile="test",
            **settings,
        ),
        tmp_path / "state",
        on_demote=on_demote,
    )


def write_multi_package(root: Path, variants: list[tuple[str, str]]) -> Path:
    """The tiny package with extra (runtime, precision) variants; OpenVINO reads the .onnx.

    The extra variants record no SHA-256, so a test may swap one's file for a model that
    computes garbage (what a broken device does) and the package still loads.
    """
    write_tiny_package(root)
    source = root / "tiny.fp32.onnx"
    files = [VariantFiles("onnxruntime", "fp32", (source.name,))]
    for runtime, precision in variants:
        if (runtime, precision) == ("onnxruntime", "fp32"):
            continue
        target = root / f"tiny.{runtime}.{precision}.onnx"
        if precision == "int8":
            from onnxruntime.quantization import quantize_dynamic

            quantize_dynamic(str(source), str(target))
        else:
            shutil.copyfile(source, target)
        files.append(VariantFiles(runtime, precision, (target.name,)))
    write_manifest(root, tiny_manifest("tiny", "1", 4, tuple(files)))
    data = read_model_toml(root)
    for variant in data["variant"][1:]:
        del variant["sha256"]
    write_model_toml(root, data)
    return root


class FlakySession(OnnxSession):
    """A real onnxruntime session that fails once its device "goes away"."""

    def __init__(self, session, request, plugin: FlakyOnnx) -> None:
        super().__init__(session, request)
        self._plugin = plugin

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._plugin.calls += 1
        batch = next(iter(feeds.values())).shape[0]
        plugin = self._plugin
        broken = plugin.good_calls < plugin.calls <= plugin.good_calls + plugin.bad_calls
        if broken or batch > self._plugin.max_batch:
            # onnxruntime itself rejects this: a wrong-rank tensor for the model's input
            feeds = {name: np.zeros((1, 1), np.float32) for name in feeds}
        return super().run(feeds)


class FlakyOnnx(OnnxRuntime):
    """The onnxruntime plugin, but each session breaks after ``good_calls`` runs in total (and
    comes back after ``bad_calls`` failed runs: a device that recovers)."""

    def __init__(
        self, good_calls: int = 10**9, max_batch: int = 10**9, bad_calls: int = 10**9
    ) -> None:
        self.good_calls = good_calls
        self.bad_calls = bad_calls
        self.max_batch = max_batch
        self.calls = 0
        self.loads = 0

    def load(self, request):
        session = super().load(request)
        self.loads += 1
        return FlakySession(session._session, request, self)


def install_flaky(monkeypatch: pytest.MonkeyPatch) -> FlakyOnnx:
    """Install the flaky plugin as "onnxruntime" in the plugin registry for one test."""
    plugin = FlakyOnnx()
    monkeypatch.setitem(runtimes._loaded, "onnxruntime", plugin)
    return plugin
