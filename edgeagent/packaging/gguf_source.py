"""What a GGUF file says about itself, read with the ``gguf`` library (llama.cpp's own reader).

The package's ``[text]`` table is recorded from this — architecture, trained context, whether
a chat template is carried, the begin and end tokens — so nothing about the model is typed by
hand. The quantization and the bits a weight takes decide which of several files is the
reference the others are judged against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.packaging.errors import PackagingError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GgufFacts:
    path: Path
    architecture: str
    context: int  # trained context, tokens
    chat_template: str | None
    bos: str
    eos: str
    vocabulary: int
    precision: str  # lower-case quantization name: q4_1, q4_k_m, f16 …
    bits_per_weight: float  # over every tensor: the higher, the closer to the trained model
    title: str  # general.name, for the description


def read_gguf(path: Path) -> GgufFacts:
    """The facts of ``path``; PackagingError naming the file when it is not a usable GGUF."""
    if path.is_dir():
        raise PackagingError(f"{path}: a folder, but not a Hugging Face model (no config.json)")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise PackagingError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    if magic != GGUF_MAGIC:
        raise PackagingError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    from gguf import GGUFReader, LlamaFileType

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader's own words: truncated, unknown version, bad type
        raise PackagingError(f"{path}: a damaged GGUF file: {exc}") from exc
    fields = reader.fields

    def value(key: str, default: Any = None) -> Any:
        found = fields.get(key)
        return default if found is None else found.contents()

    architecture = value("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise PackagingError(f"{path}: the GGUF names no general.architecture")
    context = value(f"{architecture}.context_length")
    if not isinstance(context, int) or context < 1:
        raise PackagingError(f"{path}: the GGUF has no {architecture}.context_length")
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise PackagingError(f"{path}: the GGUF carries no tokenizer (tokenizer.ggml.tokens)")

    def token(key: str) -> str:
        index = value(key)
        if not isinstance(index, int) or not 0 <= index < len(tokens.data):
            return ""
        return bytes(tokens.parts[tokens.data[index]]).decode("utf-8", "replace")

    file_type = value("general.file_type")
    try:
        precision = LlamaFileType(file_type).name.split("_", 1)[1].lower()
    except (ValueError, IndexError):
        precision = f"type{file_type}" if file_type is not None else "unknown"
    elements = sum(int(t.n_elements) for t in reader.tensors)
    stored = sum(int(t.n_bytes) for t in reader.tensors)
    template = value("tokenizer.chat_template")
    return GgufFacts(
        path=path,
        architecture=architecture,
        context=context,
        chat_template=template if isinstance(template, str) and template else None,
        bos=token("tokenizer.ggml.bos_token_id"),
        eos=token("tokenizer.ggml.eos_token_id"),
        vocabulary=len(tokens.data),
        precision=precision,
        bits_per_weight=8 * stored / elements if elements else 0.0,
        title=str(value("general.name", "") or ""),
    )


def is_hugging_face_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()
