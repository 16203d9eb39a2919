"""A Hugging Face model folder → one GGUF file (f16), written with the ``gguf`` library's writer.

What llama.cpp's own ``convert_hf_to_gguf.py`` does for the Llama family, for the folders this
packager accepts: ``config.json`` (``LlamaForCausalLM`` or ``MistralForCausalLM``, plain RoPE),
the weights in ``model.safetensors`` (or its shards), a byte-level BPE ``tokenizer.json`` and
the chat template from ``tokenizer_config.json`` / ``chat_template.jinja``. Tensor names come
from gguf's own name map; Q and K are permuted into llama.cpp's RoPE layout as the script
does; matrices are stored f16, norms f32. No ``transformers`` is needed to read the folder
(the packager runs where the runtimes are, not the training stack); a folder outside that
set is refused with what to do instead.

Safetensors is read here with numpy (an 8-byte header length, a JSON header of dtype, shape
and byte offsets, then the raw little-endian data): the format is that small, and the
``safetensors`` distribution is not among the runtime environment's dependencies.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.packaging.errors import PackagingError

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
# tokenizer.json pre-tokenizers → llama.cpp's name for the same split (tokenizer.ggml.pre)
_BYTE_LEVEL = {"type": "ByteLevel", "use_regex": True}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackagingError(f"{path}: not readable JSON: {exc}") from exc


def _tensors(folder: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor of the folder's safetensors file(s), as float32 arrays, in file order."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(_read_json(index).get("weight_map", {}).values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        path = folder / name
        if not path.is_file():
            raise PackagingError(f"{folder}: no {name} (the weights, as safetensors)")
        yield from _safetensors(path)


def _safetensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            (size,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8 : 8 + size])
        except (struct.error, ValueError) as exc:
            raise PackagingError(f"{path}: not a safetensors file: {exc}") from exc
        base = 8 + size
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype = _DTYPES.get(entry.get("dtype"))
            if dtype is None:
                raise PackagingError(f"{path}: {name} is {entry.get('dtype')}; F32, F16 or BF16")
            start, end = entry["data_offsets"]
            array = np.frombuffer(data[base + start : base + end], dtype=dtype)
            if dtype is np.uint16:  # bfloat16: the upper half of a float32
                array = (array.astype(np.uint32) << 16).view(np.float32)
            yield name, array.astype(np.float32).reshape(entry["shape"])


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's rotary halves → llama.cpp's interleaved pairs (convert_hf_to_gguf's)."""
    shape = weights.shape
    return (
        weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )


def _pre_tokenizer(tokenizer: dict[str, Any], folder: Path) -> str:
    """llama.cpp's name for the tokenizer's split; refuse one it would split differently."""
    pre = tokenizer.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]

    def byte_level(step: dict[str, Any]) -> bool:
        return all(step.get(k) == v for k, v in _BYTE_LEVEL.items())

    if len(steps) == 1 and byte_level(steps[0]):
        return "gpt-2"
    if (
        len(steps) == 2
        and steps[0] == {"type": "Digits", "individual_digits": True}
        and byte_level(steps[1])
    ):
        return "smollm"  # digits one by one, then GPT-2's split (SmolLM's tokenizer)
    raise PackagingError(
        f"{folder}: its tokenizer's pre-tokenizer ({json.dumps(pre)[:200]}) is not one this "
        "converter knows (byte-level BPE as GPT-2 or SmolLM split): convert the folder with "
        "llama.cpp's convert_hf_to_gguf.py and package the .gguf"
    )


def _token_id(tokens: dict[str, int], value: Any) -> int | None:
    text = value.get("content") if isinstance(value, dict) else value
    return tokens.get(text) if isinstance(text, str) else None


def _vocabulary(folder: Path, size: int, writer: Any) -> None:
    """The tokenizer's tokens, types and merges, the special ids and the chat template."""
    import gguf

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise PackagingError(f"{folder}: no tokenizer.json (a byte-level BPE tokenizer)")
    tokenizer = _read_json(path)
    model = tokenizer.get("model", {})
    if model.get("type") != "BPE" or (tokenizer.get("decoder") or {}).get("type") != "ByteLevel":
        raise PackagingError(
            f"{path}: a {model.get('type')} tokenizer; only byte-level BPE is converted here "
            "(convert others with llama.cpp's convert_hf_to_gguf.py)"
        )
    pre = _pre_tokenizer(tokenizer, folder)
    ids: dict[str, int] = dict(model["vocab"])
    kinds = {index: gguf.TokenType.NORMAL for index in ids.values()}
    for added in tokenizer.get("added_tokens", []):
        ids[added["content"]] = added["id"]
        special = added.get("special", False)
        kinds[added["id"]] = gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED
    size = max(size, max(ids.values()) + 1)
    names = {index: token for token, index in ids.items()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list([names.get(i, f"[PAD{i}]") for i in range(size)])
    writer.add_token_types([kinds.get(i, gguf.TokenType.UNUSED) for i in range(size)])
    merges = model.get("merges", [])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    model_config = _read_json(folder / "config.json")
    bos = _token_id(ids, config.get("bos_token")) or model_config.get("bos_token_id")
    eos = _token_id(ids, config.get("eos_token")) or model_config.get("eos_token_id")
    if isinstance(bos, int):
        writer.add_bos_token_id(bos)
    if isinstance(eos, int):
        writer.add_eos_token_id(eos)
    writer.add_add_bos_token(bool(config.get("add_bos_token", False)))
    template = config.get("chat_template")
    if not isinstance(template, str) and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, str) and template:
        writer.add_chat_template(template)


def convert_hf_folder(folder: Path, out: Path) -> Path:
    """``folder`` (a Hugging Face Llama-family model) → ``out`` (GGUF, f16); returns ``out``."""
    import gguf

    config = _read_json(folder / "config.json")
    architecture = (config.get("architectures") or ["?"])[0]
    if architecture not in ARCHITECTURES:
        raise PackagingError(
            f"{folder}: a {architecture} model; this packager converts {', '.join(ARCHITECTURES)}"
            " (convert others with llama.cpp's convert_hf_to_gguf.py and package the .gguf)"
        )
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise PackagingError(f"{folder}: RoPE scaling {rope} is not converted here")
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        writer = gguf.GGUFWriter(str(out), "llama")
        writer.add_name(folder.name)
        writer.add_context_length(int(config["max_position_embeddings"]))
        writer.add_embedding_length(hidden)
        writer.add_block_count(layers)
        writer.add_feed_forward_length(int(config["intermediate_size"]))
        writer.add_rope_dimension_count(head_dim)
        writer.add_head_count(heads)
        writer.add_head_count_kv(kv_heads)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
        writer.add_rope_freq_base(float(config.get("rope_theta", rope.get("rope_theta", 1e4))))
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        _vocabulary(folder, int(config["vocab_size"]), writer)
    except (KeyError, TypeError, ValueError) as exc:
        problem = f"lacks what a Llama model needs: {exc}"
        raise PackagingError(f"{folder}/config.json: {problem}") from exc
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    for name, array in _tensors(folder):
        if name.endswith("rotary_emb.inv_freq"):
            continue  # recomputed by llama.cpp from rope_freq_base
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise PackagingError(f"{folder}: tensor {name} has no GGUF name (not a Llama layer)")
        if name.endswith("q_proj.weight"):
            array = _permute(array, heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, kv_heads)
        writer.add_tensor(target, array.astype(np.float16 if array.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
