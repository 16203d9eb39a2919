"""``edgeagent package model.gguf``: a language model's package from the GGUF's own metadata,
every variant judged by greedy agreement and held-out perplexity against the reference.

The model is SmolLM2-135M-Instruct Q4_1 (fetched by scripts/fetch_models.py); a second
variant, Q4_0, is requantized from it here by llama.cpp's own quantizer, so there is a
lower-precision file to judge. Two threads and a 1024-token context: seconds per packaging.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
from pathlib import Path

import pytest

from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.models.text_golden import load_text_golden
from tests.support.language import smollm2_gguf

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

Q4_0 = 2  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_0


def package(*argv: str) -> tuple[int, dict | None, str]:
    """Exit status, the JSON report (None on failure) and what went to stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["package", *argv, "--threads", "2", "--json"])
    return status, json.loads(out.getvalue()) if status == 0 else None, err.getvalue()


@pytest.fixture(scope="module")
def q4_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q4_0 requantization of the Q4_1 file: a second variant of the same model."""
    source = smollm2_gguf()
    target = tmp_path_factory.mktemp("quant") / "smollm2-135m-instruct-q4_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = Q4_0
    params.allow_requantize = True
    params.nthread = 2
    failed = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    assert failed == 0 and target.is_file()
    return target


def test_a_gguf_becomes_a_package_that_records_its_own_metadata(tmp_path: Path) -> None:
    out = tmp_path / "smollm2"
    status, report, err = package(str(smollm2_gguf()), "--name", "smollm2", "--out", str(out))
    assert status == 0, err
    assert report is not None and report["reference"] == "llama_cpp/q4_1"
    loaded = load_package(out)
    assert loaded.task == "text-generation" and loaded.name == "smollm2"
    assert loaded.text is not None
    assert (loaded.text.architecture, loaded.text.context) == ("llama", 8192)
    assert loaded.text.chat_template and loaded.text.eos == "<|im_end|>"
    assert [v.key for v in loaded.variants] == ["llama_cpp/q4_1"]
    golden = load_text_golden(out / "golden.json")
    assert len(golden.prompts) == 4 and golden.max_tokens == 16
    for prompt in golden.prompts:  # rendered by the file's own template, answered greedily
        assert prompt.prompt.endswith("<|im_start|>assistant\n")
        assert 1 <= len(prompt.tokens["llama_cpp/q4_1"]) <= 16
    assert len(golden.heldout_tokens) > 250
    assert 1 < golden.perplexity["llama_cpp/q4_1"] < 200  # a model that reads English
    assert golden.tokens_per_second["llama_cpp/q4_1"] > 0


def test_a_variant_outside_the_flags_is_dropped_with_its_figures(
    tmp_path: Path, q4_0: Path
) -> None:
    out = tmp_path / "two"
    status, report, err = package(
        str(q4_0),  # given first: the reference is the higher precision, not the first file
        str(smollm2_gguf()),
        "--out",
        str(out),
        "--min-agreement",
        "1.0",
        "--max-perplexity-ratio",
        "1.0",
    )
    assert status == 0, err
    assert report is not None and report["reference"] == "llama_cpp/q4_1"
    figures = {v["variant"]: v for v in report["variants"]}
    dropped = figures["llama_cpp/q4_0"]
    assert dropped["kept"] is False and "perplexity ratio" in dropped["dropped"]
    assert dropped["perplexity_ratio"] > 1.0 and 0 <= dropped["agreement"] <= 1
    assert "llama_cpp/q4_0" in err and "DROPPED" in err  # the figures, printed
    assert [v.key for v in load_package(out).variants] == ["llama_cpp/q4_1"]
    assert not (out / q4_0.name).exists()  # never packaged


def test_a_variant_within_the_flags_is_kept_beside_the_reference(
    tmp_path: Path, q4_0: Path
) -> None:
    out = tmp_path / "both"
    status, _, err = package(
        str(smollm2_gguf()),
        str(q4_0),
        "--out",
        str(out),
        "--min-agreement",
        "0",
        "--max-perplexity-ratio",
        "100",
    )
    assert status == 0, err
    keys = sorted(v.key for v in load_package(out).variants)
    assert keys == ["llama_cpp/q4_0", "llama_cpp/q4_1"]
    golden = load_text_golden(out / "golden.json")
    assert all(set(p.tokens) == set(keys) for p in golden.prompts)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"not a model at all", "not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00" + b"\xff" * 64, "damaged GGUF"),
    ],
)
def test_a_bad_file_is_refused_with_a_clear_error(
    tmp_path: Path, content: bytes, words: str
) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(content)
    status, _, err = package(str(bad), "--out", str(tmp_path / "out"))
    assert status == 2 and words in err and "broken.gguf" in err
    assert not (tmp_path / "out").exists()


def test_a_gguf_and_an_onnx_file_are_not_one_package(tmp_path: Path) -> None:
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"x")
    status, _, err = package(str(smollm2_gguf()), str(onnx), "--out", str(tmp_path / "o"))
    assert status == 2 and "package them apart" in err


def test_one_quantization_given_twice_is_refused(tmp_path: Path) -> None:
    twin = tmp_path / "copy" / "again.gguf"
    twin.parent.mkdir()
    twin.symlink_to(smollm2_gguf())
    status, _, err = package(str(smollm2_gguf()), str(twin), "--out", str(tmp_path / "out"))
    assert status == 2 and "two files are q4_1" in err
    assert not (tmp_path / "out").exists()
