"""Class names and input size a model file carries about itself, so nobody has to guess them.

Exporters write them where their own runtimes look: Ultralytics puts ``names`` (a Python dict
literal, ``"{0: 'person', 1: 'bicycle'}"``) and ``imgsz`` (``"[640, 640]"``) into the ONNX
``metadata_props``; PaddleOCR's ONNX exports carry a ``character`` list; a TFLite file with
metadata is also a zip archive whose associated files include the label file. A class count
read from here is the model's own, never a default of 1.

Every value is text from a file of unknown origin: it is parsed with ``ast.literal_eval`` (no
code runs), bounded in size, and anything malformed reads as "not there" rather than failing.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Mapping
from pathlib import Path

MAX_METADATA_CHARS = 1_000_000  # a names table of 100k classes; larger values are ignored
MAX_LABEL_CHARS = 200  # one class name
LABEL_FILE_SUFFIXES = (".txt", ".labels")


def onnx_metadata(path: Path) -> dict[str, str]:
    """An ONNX file's ``metadata_props`` as a dict (empty for other formats or none)."""
    if path.suffix != ".onnx":
        return {}
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props if len(p.value) <= MAX_METADATA_CHARS}


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _clean(names: list[object]) -> tuple[str, ...] | None:
    """Names as label-file lines: strings, one line each, bounded; None when unusable."""
    if not names or not all(isinstance(n, (str, int)) for n in names):
        return None
    cleaned = tuple(" ".join(str(n).split())[:MAX_LABEL_CHARS] for n in names)
    return cleaned if all(cleaned) else None


def names_from_metadata(meta: Mapping[str, str]) -> tuple[str, ...] | None:
    """Ultralytics ``names`` (a dict of index → name, or a list), else a ``character`` list."""
    if "names" in meta:
        value = _literal(meta["names"])
        if isinstance(value, dict):
            keys = sorted(value)
            if keys == list(range(len(keys))):  # indices 0..n-1, each once
                return _clean([value[k] for k in keys])
        elif isinstance(value, (list, tuple)):
            return _clean(list(value))
    if "character" in meta:
        text = meta["character"]
        value = _literal(text) if text.lstrip().startswith("[") else None
        if isinstance(value, (list, tuple)):
            return _clean(list(value))
        return _clean([line for line in text.splitlines() if line.strip()])
    return None


def image_size_from_metadata(meta: Mapping[str, str]) -> tuple[int, int] | None:
    """Ultralytics ``imgsz`` as (height, width): ``[640, 640]``, or one int for a square."""
    value = _literal(meta.get("imgsz", ""))
    if isinstance(value, int):
        value = [value, value]
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and 0 < v <= 8192 for v in value)
    ):
        return int(value[0]), int(value[1])
    return None


# Metadata keys exporters use for the resampling filter of their resize: ours, timm's
# ``interpolation`` (its pretrained_cfg), torchvision's and Pillow's words.
FILTER_KEYS = ("resize_filter", "interpolation", "resample", "resize_interpolation")
_FILTER_WORDS = {
    "bilinear": "bilinear",
    "linear": "bilinear",
    "inter_linear": "bilinear",
    "nearest": "nearest",
    "inter_nearest": "nearest",
    "bicubic": "bicubic",
    "cubic": "bicubic",
    "inter_cubic": "bicubic",
    "lanczos": "lanczos",
    "antialias": "lanczos",
    "inter_lanczos4": "lanczos",
    "area": "area",
    "box": "area",
    "inter_area": "area",
    "hamming": "hamming",
}


def resize_filter_from_metadata(meta: Mapping[str, str]) -> str | None:
    """The filter the model's metadata names (``interpolation = "bicubic"``), or None."""
    for key in FILTER_KEYS:
        word = str(meta.get(key, "")).strip().lower().removeprefix("cv2.")
        if word in _FILTER_WORDS:
            return _FILTER_WORDS[word]
    return None


def tflite_label_file(path: Path) -> tuple[str, ...] | None:
    """The label file packed into a TFLite model's metadata (the file doubles as a zip)."""
    if path.suffix != ".tflite" or not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            members = [
                m
                for m in archive.infolist()
                if m.filename.lower().endswith(LABEL_FILE_SUFFIXES)
                and m.file_size <= MAX_METADATA_CHARS
            ]
            if not members:
                return None
            text = archive.read(members[0]).decode("utf-8", errors="replace")
    except (zipfile.BadZipFile, OSError):
        return None
    return _clean([line for line in text.splitlines() if line.strip()])


def model_labels(path: Path, meta: Mapping[str, str]) -> tuple[str, ...] | None:
    """The class names the file itself carries, whichever way its format stores them."""
    return names_from_metadata(meta) if path.suffix == ".onnx" else tflite_label_file(path)
