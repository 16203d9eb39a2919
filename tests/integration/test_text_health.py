"""The update health check of a language model: the installed variant must repeat the golden
chats' greedy tokens recorded by ``edgeagent package`` and decode within the tokens/s floor;
a package whose record was tampered with fails, and its release is marked bad."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeagent.cli import main
from edgeagent.fleet import outcomes
from edgeagent.models.package import ModelPackage, load_package
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.health import health_check
from edgeagent.updates.text_health import text_health_check
from tests.support.language import smollm2_gguf

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("llm") / "smollm2"
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        status = main(["package", str(smollm2_gguf()), "--out", str(out), "--threads", "2"])
    assert status == 0
    return out


def tampered(packaged: Path, tmp_path: Path, change) -> ModelPackage:  # type: ignore[no-untyped-def]
    """A copy of the package whose golden.json ``change`` rewrote."""
    copy = tmp_path / "pkg"
    shutil.copytree(packaged, copy)
    record = json.loads((copy / "golden.json").read_text())
    change(record)
    (copy / "golden.json").write_text(json.dumps(record))
    return load_package(copy)


async def test_the_untouched_package_passes(packaged: Path) -> None:
    await text_health_check(load_package(packaged), TIMEOUT_S, floor=0.0)


async def test_a_tampered_greedy_record_fails_and_marks_the_release_bad(
    packaged: Path, tmp_path: Path
) -> None:
    def change(record: dict) -> None:
        tokens = record["prompts"][0]["tokens"]["llama_cpp/q4_1"]
        tokens[0] = (tokens[0] + 1) % 49152

    with pytest.raises(InstallFailed) as failed:
        await text_health_check(tampered(packaged, tmp_path, change), TIMEOUT_S, floor=0.0)
    assert failed.value.code == outcomes.HEALTH_CHECK_FAILED and failed.value.bad
    assert "golden prompt 0" in str(failed.value) and "differ from the record" in str(failed.value)


async def test_a_rate_far_below_the_recorded_one_fails_naming_the_key(
    packaged: Path, tmp_path: Path
) -> None:
    def change(record: dict) -> None:
        record["tokens_per_second"]["llama_cpp/q4_1"] = 1e9  # no CPU decodes this fast

    package = tampered(packaged, tmp_path, change)
    with pytest.raises(InstallFailed) as failed:
        await text_health_check(package, TIMEOUT_S, floor=0.1)
    assert "llm_tokens_per_second_floor" in str(failed.value)
    await text_health_check(package, TIMEOUT_S, floor=0.0)  # 0: no floor


async def test_an_unreadable_record_fails_naming_the_file(packaged: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pkg"
    shutil.copytree(packaged, copy)
    (copy / "golden.json").write_text("{not json")
    with pytest.raises(InstallFailed) as failed:
        await text_health_check(load_package(copy), TIMEOUT_S, floor=0.0)
    assert "golden.json" in str(failed.value) and failed.value.bad


@dataclass
class Loaded:
    """What the updater's health check is handed: the served model's package."""

    package: ModelPackage

    async def infer(self, feeds, *, priority=0, timeout_s=None):  # type: ignore[no-untyped-def]
        raise AssertionError("a language model is not checked with tensor feeds")


async def test_the_updater_health_check_replays_a_language_model(
    packaged: Path, tmp_path: Path
) -> None:
    await health_check(Loaded(load_package(packaged)), TIMEOUT_S, llm_floor=0.0)

    def change(record: dict) -> None:
        record["prompts"][1]["tokens"]["llama_cpp/q4_1"] = [0, 0, 0]

    with pytest.raises(InstallFailed, match="golden prompt 1"):
        await health_check(Loaded(tampered(packaged, tmp_path, change)), TIMEOUT_S)


async def test_the_check_runs_on_the_staged_copy_that_then_serves(
    packaged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No second copy: the release is placed once, checked there, and that copy serves."""
    from prometheus_client import CollectorRegistry

    from edgeagent.engine.language import plane as plane_module
    from edgeagent.engine.language.plane import LanguagePlane
    from edgeagent.engine.language.settings import LanguageSettings
    from edgeagent.engine.planes import Planes, ServedText
    from edgeagent.engine.text_requests import GenerationRequest, Sampling
    from edgeagent.updates import text_health

    def no_copy(*_: object) -> None:
        raise AssertionError("the health check loaded a copy of the model")

    placements = []

    def counted(*args: object) -> object:
        placements.append(args)
        return place(*args)

    place = plane_module.place
    monkeypatch.setattr(text_health, "_replay", no_copy)
    monkeypatch.setattr(plane_module, "place", counted)
    plane = LanguagePlane(
        LanguageSettings(context=512, sequences=2, threads=2), metrics=CollectorRegistry()
    )
    planes = Planes(registry=None, language=plane)  # type: ignore[arg-type]
    try:
        staged = await planes.stage(packaged)
        assert plane.names() == []  # placed, not serving
        await health_check(staged, TIMEOUT_S, llm_floor=0.0)

        def change(record: dict) -> None:
            record["prompts"][2]["tokens"]["llama_cpp/q4_1"] = [0, 0, 0]

        other = ServedText(tampered(packaged, tmp_path, change), staged.replay)
        with pytest.raises(InstallFailed, match="golden prompt 2"):
            await health_check(other, TIMEOUT_S)  # the staged copy's answers, another record

        info = await plane.load(packaged)  # activation: the checked copy serves
        assert len(placements) == 1 and plane.names() == [info.name]
        stream = await plane.generate(
            GenerationRequest(info.name, prompt="Once upon a time", sampling=Sampling(4, 0.0))
        )
        assert "".join([chunk.text async for chunk in stream])
    finally:
        await plane.close()
