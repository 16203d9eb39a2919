"""A language model's package (task text-generation / embedding): the [text] table and its
variants on generative runtimes, every bad field refused naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.models.manifest_writer import dumps
from edgeagent.models.package import PackageError, load_package
from edgeagent.models.text_spec import TextSpec
from tests.support import language

GGUF = "smollm2-135m-instruct-q4_1.gguf"
MANIFEST = dumps({**language.text_table(), "golden": "golden.json"})


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "smollm2"
    root.mkdir()
    (root / "model.toml").write_text(MANIFEST)
    (root / GGUF).write_bytes(b"GGUF" + bytes(60))
    (root / "golden.json").write_text("{}")
    return root


def _edit(root: Path, old: str, new: str) -> None:
    text = (root / "model.toml").read_text()
    assert old in text
    (root / "model.toml").write_text(text.replace(old, new, 1))


def test_a_text_generation_package_is_read(package: Path) -> None:
    loaded = load_package(package)
    assert loaded.task == "text-generation"
    assert loaded.text == TextSpec(
        "llama", 8192, True, "<|im_start|>", "<|im_end|>", ("<|im_end|>",)
    )
    assert [v.key for v in loaded.variants] == ["llama_cpp/q4_1"]
    assert loaded.variants[0].files == (package / GGUF,)
    assert loaded.inputs == () and loaded.golden == package / "golden.json"


def test_an_embedding_package_is_read(package: Path) -> None:
    _edit(package, 'task = "text-generation"', 'task = "embedding"')
    assert load_package(package).task == "embedding"


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ("context = 8192", "context = 0", r"text.context: 0 is not a context length"),
        ("context = 8192", 'context = "8k"', r"text.context: must be an integer, got str"),
        ("context = 8192\n", "", r"text.context: missing required field"),
        ('architecture = "llama"', 'architecture = " "', r"text.architecture: must name"),
        ("chat_template = true", 'chat_template = "yes"', r"text.chat_template: must be bool"),
        ('stop = ["<|im_end|>"]', 'stop = [""]', r"text.stop: must be a list of at most 16"),
        ('stop = ["<|im_end|>"]', "stop = [1]", r"text.stop: must be a list"),
        ("bos = ", "bso = ", r"text: unknown field\(s\) bso \(did you mean bos\?\)"),
        ('precision = "q4_1"', 'precision = "Q4 1"', r"variant\[0\].precision: 'Q4 1' is not a"),
        ('runtime = "llama_cpp"', 'runtime = "onnxruntime"', r"variant\[0\].runtime: onnxrunt"),
        ('runtime = "llama_cpp"', 'runtime = "llama"', r"variant\[0\].runtime: 'llama' is not one"),
        (
            f'files = ["{GGUF}"]',
            'files = ["x.onnx"]',
            r"'x.onnx' is not a llama_cpp file",
        ),
        (f'files = ["{GGUF}"]', 'files = ["../a.gguf"]', r"points outside the package"),
        ('golden = "golden.json"', 'golden = "nope.json"', r"golden: file 'nope.json' does not"),
        ('task = "text-generation"', 'task = "chat"', r"task: 'chat' is not one of classification"),
        ("[text]", "[texts]", r"unknown field\(s\) texts"),
    ],
)
def test_a_bad_field_is_refused_naming_file_and_field(
    package: Path, old: str, new: str, error: str
) -> None:
    _edit(package, old, new)
    with pytest.raises(PackageError, match=error) as caught:
        load_package(package)
    assert str(package / "model.toml") in str(caught.value)


def test_tensor_tables_in_a_language_package_are_refused(package: Path) -> None:
    with (package / "model.toml").open("a") as manifest:
        manifest.write('\n[[inputs]]\nname = "x"\ndtype = "float32"\nshape = [1]\n')
    with pytest.raises(PackageError, match="a text-generation package has no inputs"):
        load_package(package)


def test_a_missing_text_table_is_refused(package: Path) -> None:
    text = (package / "model.toml").read_text()
    start, end = text.index("[text]"), text.index("[[variant]]")
    (package / "model.toml").write_text(text[:start] + text[end:])
    with pytest.raises(PackageError, match=r"model.toml: text: missing required field"):
        load_package(package)


def test_a_variant_declared_twice_is_refused(package: Path) -> None:
    text = (package / "model.toml").read_text()
    (package / "model.toml").write_text(text + text[text.index("[[variant]]") :])
    with pytest.raises(PackageError, match="variant: llama_cpp/q4_1 is declared twice"):
        load_package(package)
