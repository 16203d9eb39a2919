"""Which plane a release goes to, and which of a language release's variants a device fetches."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.engine.planes import is_language_package, language_variants


def test_a_language_release_fetches_its_first_variant_whose_runtime_is_installed() -> None:
    pytest.importorskip("llama_cpp")
    offered = ["onnxruntime/fp32", "llama_cpp/q8_0", "llama_cpp/q4_1"]
    assert language_variants(offered) == ["llama_cpp/q8_0"]


def test_a_tensor_release_is_left_to_the_hardware_ranking() -> None:
    assert language_variants(["onnxruntime/fp32", "openvino/int8"]) == []
    assert language_variants([]) == []


@pytest.mark.parametrize(
    ("toml", "language"),
    [
        ('name = "m"\ntask = "text-generation"\n', True),
        ('name = "m"\ntask = "embedding"\n', True),
        ('name = "m"\ntask = "classification"\n', False),
        ("name = [broken", False),  # the tensor registry reports why it cannot load it
        (None, False),
    ],
)
def test_the_plane_is_chosen_by_the_task_alone(tmp_path: Path, toml: str | None, language: bool):
    if toml is not None:
        (tmp_path / "model.toml").write_text(toml)
    assert is_language_package(tmp_path) is language
