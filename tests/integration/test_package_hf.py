"""``edgeagent package ./hf_folder --openvino``: a Hugging Face Llama folder converted to an
f16 GGUF (packaging/hf_gguf.py, gguf's writer), quantized by llama.cpp, each GGUF also as
OpenVINO GenAI's IR, every variant judged like GGUF files are.

The folder is made here by transformers in the build environment (.venv-build): a tiny
random-weight Llama and a byte-level BPE tokenizer trained on a few sentences, nothing
downloaded; transformers' own token ids and logits for a sample text are the reference the
conversion must reproduce in llama.cpp.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.models.text_golden import load_text_golden
from tests.support.helpers import REPO

llama_cpp_plugin = pytest.importorskip("edgeagent.runtimes.llama_cpp")
pytest.importorskip("gguf")
try:  # OpenVINO GenAI's variants are judged where it is installed
    import edgeagent.runtimes.openvino_genai  # noqa: F401

    OPENVINO: tuple[str, ...] = ("--openvino",)
except Exception:
    OPENVINO = ()
BUILD_PYTHON = Path(os.environ.get("EDGEAGENT_BUILD_PYTHON", REPO / ".venv-build/bin/python"))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not BUILD_PYTHON.exists():
        pytest.skip(f"no build environment at {BUILD_PYTHON} (scripts/setup.sh makes it)")
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    subprocess.run(
        [str(BUILD_PYTHON), str(REPO / "tests/support/tiny_hf_llama.py"), str(folder)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return folder


def package(*argv: str) -> tuple[int, dict | None, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["package", *argv, "--threads", "2", "--json", "--golden-tokens", "4"])
    return status, json.loads(out.getvalue()) if status == 0 else None, err.getvalue()


def test_a_hugging_face_folder_becomes_a_judged_package(hf_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    status, report, err = package(str(hf_folder), "--out", str(out), *OPENVINO)
    assert status == 0, err
    assert report is not None and report["reference"] == "llama_cpp/f16"
    judged = ["llama_cpp/f16", "llama_cpp/q8_0"]
    if OPENVINO:
        judged += ["openvino_genai/f16", "openvino_genai/q8_0"]
    assert [v["variant"] for v in report["variants"]] == judged
    assert all(v["perplexity"] > 1 for v in report["variants"])  # each one measured
    loaded = load_package(out)
    assert loaded.name == "tiny-llama" and loaded.text is not None
    assert (loaded.text.architecture, loaded.text.context) == ("llama", 512)
    assert (loaded.text.bos, loaded.text.eos) == ("<|im_start|>", "<|im_end|>")
    assert loaded.text.chat_template  # the folder's template travelled into the GGUF
    kept = {v["variant"] for v in report["variants"] if v["kept"]}
    assert {variant.key for variant in loaded.variants} == kept
    for variant in loaded.variants:  # an IR variant's files in its own folder
        if variant.runtime == "openvino_genai":
            assert variant.files[0].parent.name == f"openvino-{variant.precision}"
    golden = load_text_golden(out / "golden.json")
    assert golden.reference == "llama_cpp/f16"
    assert golden.prompts[0].prompt.startswith("<|im_start|>user\n")
    assert not list(tmp_path.glob(".tiny.hf-*"))  # the conversion's work folder is gone

    # the f16 file computes what transformers computed for the same text
    from edgeagent.runtimes.generative import GenerativeLoadRequest, SequenceInput

    reference = json.loads((hf_folder / "reference.json").read_text())
    f16 = next(v for v in loaded.variants if v.precision == "f16")
    session = llama_cpp_plugin.create().load(
        GenerativeLoadRequest(files=f16.files, context=64, sequences=1, threads=2)
    )
    try:
        assert session.tokenize(reference["text"], add_special=False) == reference["ids"]
        logits = session.step([SequenceInput(0, tuple(reference["ids"]), 0)])[0]
    finally:
        session.close()
    expected = np.array(reference["logits"])
    assert int(logits.argmax()) == int(expected.argmax())
    np.testing.assert_allclose(logits, expected, atol=0.01 * np.abs(expected).max())


def test_a_folder_of_another_architecture_is_refused_saying_what_converts_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    status, _, err = package(str(folder), "--out", str(tmp_path / "out"))
    assert status == 2 and "GPT2LMHeadModel" in err and "convert_hf_to_gguf.py" in err
    assert not (tmp_path / "out").exists()
