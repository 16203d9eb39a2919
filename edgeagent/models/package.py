"""Model packages (SPEC §3): a directory with ``model.toml``, labels and one file set per variant.

The schema is validated completely on load so that a broken package is refused before any
runtime sees it; every error names the file and the field, because on a device in a field the
error message is all an operator gets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent._toml import tomllib
from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.detection_table import read_detection

# Names, versions and the seal scheme live in the leaf the hub and fleet read; the reader
# re-exports them for the device-side modules that already import it.
from edgeagent.models.names import NAME_RE, TASK_NAMES, VERSION_RE
from edgeagent.models.names import SEAL_SCHEME as SEAL_SCHEME
from edgeagent.models.names import version_tuple as version_tuple

# The error, the table accessors and the [serving] table have modules of their own; the reader
# re-exports what its importers name.
from edgeagent.models.serving_hints import MAX_SPREAD as MAX_SPREAD
from edgeagent.models.serving_hints import ServingHints, read_serving
from edgeagent.models.serving_hints import spread_problem as spread_problem
from edgeagent.models.toml_fields import Fields, PackageError, floats, inside
from edgeagent.runtimes.facts import RUNTIME_FACTS, RUNTIME_NAMES, weights_file

if TYPE_CHECKING:
    import numpy as np

RUNTIMES = RUNTIME_NAMES
PRECISIONS = ("fp32", "fp16", "int8")
DTYPES = (
    "float32",
    "float16",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "bool",
)
LAYOUTS = ("NCHW", "NHWC")
TASKS = TASK_NAMES  # what the model computes: decides its golden record and health check
# Which file suffixes each runtime reads; a variant whose files do not fit is refused.
RUNTIME_SUFFIXES = {name: facts.suffixes for name, facts in RUNTIME_FACTS.items()}


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as clients see it (the logical tensor, before any variant layout)."""

    name: str
    dtype: str
    shape: tuple[int, ...]  # -1 marks a variable dimension (the batch)
    layout: str | None = None


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes the input tensor; the fields mirror torchvision's usual transform."""

    size: tuple[int, int]  # (height, width) fed to the model
    resize: int | None  # shorter side before the centre crop; None = resize straight to size
    layout: str  # NCHW or NHWC
    color: str  # RGB, BGR or L
    scale: float  # pixel * scale before mean/std (1/255 maps 0..255 to 0..1)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # Scale to fit inside size keeping the aspect ratio and pad the rest (detectors trained on
    # letterboxed images, e.g. YOLO); excludes resize.
    letterbox: bool = False


@dataclass(frozen=True)
class Postprocess:
    softmax: bool  # True when the output holds logits rather than probabilities
    top_k: int


@dataclass(frozen=True)
class Variant:
    """One runnable file set: a runtime × precision, possibly with its own input layout."""

    runtime: str
    precision: str
    files: tuple[Path, ...]
    layout: str | None  # input layout of this file when it differs from the package's
    sha256: Mapping[str, str]
    # A sealed variant's encrypted files, one per entry of ``files`` (which are then absent:
    # the plaintext exists only in memory, see ``edgeagent.models.unsealer``); () when plain.
    sealed_files: tuple[Path, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.runtime}/{self.precision}"

    @property
    def stored_files(self) -> tuple[Path, ...]:
        """The files on disk: the sealed ones of a sealed variant, else ``files``."""
        return self.sealed_files or self.files


@dataclass(frozen=True)
class ModelPackage:
    root: Path
    name: str
    version: str
    task: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    preprocess: Preprocess | None
    postprocess: Postprocess
    labels: tuple[str, ...]
    variants: tuple[Variant, ...]
    serving: ServingHints = field(default_factory=ServingHints)
    golden: Path | None = None  # optional .npz of inputs + expected answers for health checks
    detection: DetectionHead | None = None  # how a detector's outputs become boxes
    anchors: np.ndarray | None = field(default=None, compare=False)  # SSD-style heads
    # ``device_files``: the files besides model.toml and the variants' that devices need
    # (labels, golden inputs, anchors, …); None when the package does not say (an older one)
    device_files: tuple[Path, ...] | None = None
    named_files: tuple[Path, ...] = ()  # what model.toml names besides variants: labels, …

    @property
    def input_layout(self) -> str:
        """The layout clients send images in: the first input's, NCHW when it declares none."""
        return self.inputs[0].layout or "NCHW"

    def variant(self, runtime: str, precision: str) -> Variant | None:
        for candidate in self.variants:
            if candidate.runtime == runtime and candidate.precision == precision:
                return candidate
        return None

    def content_hash(self) -> str:
        """SHA-256 over model.toml and every variant file: the key for probe and autotune caches."""
        digest = hashlib.sha256()
        digest.update((self.root / "model.toml").read_bytes())
        for variant in self.variants:
            for path in variant.stored_files:  # a sealed variant: its ciphertext
                digest.update(path.name.encode())
                digest.update(file_sha256(path).encode())
        return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_package(directory: str | Path) -> ModelPackage:
    """Read and validate ``directory/model.toml``; raise PackageError naming what is wrong.

    A file that cannot be read (a directory left ``chmod 000``, an I/O error) is a PackageError
    too, so whoever lists packages treats an unreadable one like any other broken one.
    """
    root = Path(directory).resolve()
    try:
        return _load(root)
    except OSError as exc:
        where = exc.filename or root
        raise PackageError(f"{where}: cannot read: {exc.strerror or exc}") from exc


def _load(root: Path) -> ModelPackage:
    manifest = root / "model.toml"
    if not root.is_dir():
        raise PackageError(f"{root}: not a model package directory")
    if not manifest.is_file():
        raise PackageError(f"{root}: model.toml is missing")
    try:
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PackageError(f"{manifest}: not valid TOML: {exc}") from exc

    top = Fields(manifest, "", data)
    top.unknown(
        {
            "name",
            "version",
            "task",
            "description",
            "labels",
            "inputs",
            "outputs",
            "preprocess",
            "postprocess",
            "serving",
            "variant",
            "golden",
            "detection",
            "device_files",
        }
    )
    name = top.get("name", str)
    if not NAME_RE.match(name):
        top.fail("must be 1-64 letters, digits, '_', '-' or '.'", "name")
    raw_version = top.get("version", (int, str))
    version = str(raw_version)
    if not VERSION_RE.match(version):
        top.fail(f"{version!r} is not an integer or MAJOR.MINOR.PATCH", "version")
    task = top.get("task", str, "classification", choices=TASKS)
    description = top.get("description", str, "")

    inputs = _tensors(manifest, "inputs", top.get("inputs", list))
    outputs = _tensors(manifest, "outputs", top.get("outputs", list))
    preprocess = _preprocess(manifest, top.get("preprocess", dict, None), inputs)
    postprocess = _postprocess(manifest, top.get("postprocess", dict, {}))
    serving = read_serving(manifest, top.get("serving", dict, {}))

    labels: tuple[str, ...] = ()
    labels_name = top.get("labels", str, None)
    if labels_name is not None:
        labels_path = inside(root, manifest, "labels", labels_name)
        if not labels_path.is_file():
            top.fail(f"file {labels_name!r} does not exist", "labels")
        labels = tuple(
            line.strip()
            for line in labels_path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        )
        classes = outputs[0].shape[-1]
        if task == "classification" and classes > 0 and len(labels) != classes:
            top.fail(
                f"{labels_name} has {len(labels)} labels but output {outputs[0].name!r} "
                f"has {classes} classes",
                "labels",
            )

    golden = None
    golden_name = top.get("golden", str, None)
    if golden_name is not None:
        golden = inside(root, manifest, "golden", golden_name)
        if not golden.is_file():
            top.fail(f"file {golden_name!r} does not exist", "golden")

    raw_variants = top.get("variant", list)
    if not raw_variants:
        top.fail("at least one [[variant]] is required", "variant")
    raw_variants = _installed_subset(root, raw_variants)
    variants = tuple(
        _variant(root, manifest, index, table) for index, table in enumerate(raw_variants)
    )
    logical_layout = inputs[0].layout or "NCHW"
    seen: set[str] = set()
    for index, variant in enumerate(variants):
        if logical_layout == "NHWC" and variant.layout == "NCHW":
            raise PackageError(
                f"{manifest}: variant[{index}].layout: an NCHW file cannot serve the NHWC input "
                f"{inputs[0].name!r} (the agent transposes NCHW requests to NHWC files only)"
            )
        if variant.key in seen:
            raise PackageError(f"{manifest}: variant: {variant.key} is declared twice")
        seen.add(variant.key)

    # A detector without [detection] is served as raw tensors (its head unknown to the agent).
    detection, anchors = None, None
    if task == "detection" and "detection" in data:
        detection, anchors = read_detection(root, manifest, top.get("detection", dict), outputs)
    elif "detection" in data:
        top.fail(f'a [detection] table needs task = "detection", not {task!r}', "detection")

    named = _named_files(root, manifest, data)
    device_files = _device_files(root, manifest, top, named)
    return ModelPackage(
        root=root,
        name=name,
        version=version,
        task=task,
        description=description,
        inputs=inputs,
        outputs=outputs,
        preprocess=preprocess,
        postprocess=postprocess,
        labels=labels,
        variants=variants,
        serving=serving,
        golden=golden,
        detection=detection,
        anchors=anchors,
        device_files=device_files,
        named_files=tuple(named.values()),
    )


def _named_files(root: Path, manifest: Path, data: dict[str, Any]) -> dict[str, Path]:
    """The files model.toml names outside its variants (already checked to exist)."""
    detection = data.get("detection")
    anchors = detection.get("anchors") if isinstance(detection, dict) else None
    named = {"labels": data.get("labels"), "golden": data.get("golden"), "anchors": anchors}
    return {
        key: inside(root, manifest, key, name)
        for key, name in named.items()
        if isinstance(name, str)
    }


def _device_files(
    root: Path, manifest: Path, top: Fields, named: dict[str, Path]
) -> tuple[Path, ...] | None:
    """``device_files``: what a device needs besides model.toml and the variant files.

    The hub ships exactly these in a release's shared archive (``hub.sign``), so held-out and
    evaluation data stay on the hub; every listed file must exist — on a device too, where
    this is how an incomplete shared archive is caught — and every file model.toml itself
    names (labels, golden inputs, a detector's anchors) must be listed, or devices would
    miss it.
    """
    names = top.get("device_files", list, None)
    if names is None:
        return None
    files = []
    for index, name in enumerate(names):
        if not isinstance(name, str) or not name:
            top.fail(f"entry {index} must be a file name, got {name!r}", "device_files")
        path = inside(root, manifest, "device_files", name)
        if not path.is_file():
            top.fail(f"file {name!r} does not exist", "device_files")
        files.append(path)
    for key, path in named.items():
        if path not in files:
            name = path.relative_to(root).as_posix()
            problem = f"the {key} file {name!r} is not listed: devices would not get it"
            top.fail(problem, "device_files")
    return tuple(dict.fromkeys(files))


INSTALLED_VARIANTS = "variants.installed"
# A sealed variant keeps its encrypted files under sealed/<runtime>.<precision>/, each at the
# name model.toml gives it, beside WRAPPED_KEY: its content key wrapped for this device.
SEALED_DIR = "sealed"
WRAPPED_KEY = "wrapped-key"


def sealed_dir(root: Path, variant_key: str) -> Path:
    """Where the variant ``runtime/precision`` of the package at ``root`` keeps sealed files."""
    return root / SEALED_DIR / variant_key.replace("/", ".")


def _installed_subset(root: Path, tables: list[Any]) -> list[Any]:
    """The ``[[variant]]`` tables this directory holds the files of.

    A device updated by a release of format 2 downloads only the variants it runs, and lists
    them (``runtime/precision``, one a line) in ``variants.installed`` beside model.toml; the
    other variants' files are absent, so they are left out. Without that file every variant
    is expected to be present.
    """
    listing = root / INSTALLED_VARIANTS
    if not listing.is_file():
        return tables
    wanted = set(listing.read_text(encoding="utf-8").split())
    keys = [
        f"{t.get('runtime')}/{t.get('precision')}" if isinstance(t, dict) else "" for t in tables
    ]
    unknown = sorted(wanted - set(keys))
    if unknown or not wanted:
        raise PackageError(
            f"{listing}: names {', '.join(unknown) or 'no variant'}; model.toml declares "
            f"{', '.join(keys)}"
        )
    return [table for table, key in zip(tables, keys, strict=True) if key in wanted]


def _tensors(manifest: Path, key: str, tables: list) -> tuple[TensorSpec, ...]:
    if not tables:
        raise PackageError(f"{manifest}: {key}: at least one tensor is required")
    specs = []
    for index, table in enumerate(tables):
        fields = Fields(manifest, f"{key}[{index}]", table)
        fields.unknown({"name", "dtype", "shape", "layout"})
        shape = fields.get("shape", list)  # [] is a scalar (Silero VAD's sample rate)
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            fields.fail("must be a list of integers (-1 for a variable size, [] a scalar)", "shape")
        if any(d == 0 or d < -1 for d in shape):
            fields.fail("dimensions must be positive or -1", "shape")
        specs.append(
            TensorSpec(
                name=fields.get("name", str),
                dtype=fields.get("dtype", str, choices=DTYPES),
                shape=tuple(shape),
                layout=fields.get("layout", str, None, choices=LAYOUTS),
            )
        )
    return tuple(specs)


def _preprocess(
    manifest: Path, table: dict | None, inputs: tuple[TensorSpec, ...]
) -> Preprocess | None:
    if table is None:
        return None
    fields = Fields(manifest, "preprocess", table)
    fields.unknown({"size", "resize", "layout", "color", "scale", "mean", "std", "letterbox"})
    size = fields.get("size", list)
    if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
        fields.fail("must be [height, width] in pixels", "size")
    color = fields.get("color", str, "RGB", choices=("RGB", "BGR", "L"))
    channels = 1 if color == "L" else 3
    mean = floats(fields, "mean", (0.0,) * channels)
    std = floats(fields, "std", (1.0,) * channels)
    if len(mean) != channels or len(std) != channels:
        fields.fail(f"mean and std need {channels} values for color {color}", "mean")
    if any(s == 0 for s in std):
        fields.fail("must not contain 0", "std")
    layout = fields.get("layout", str, inputs[0].layout or "NCHW", choices=LAYOUTS)
    resize = fields.get("resize", int, None)
    if resize is not None and resize < min(size):
        fields.fail(f"{resize} is smaller than the crop size {size}", "resize")
    letterbox = fields.get("letterbox", bool, False)
    if letterbox and resize is not None:
        fields.fail("letterbox pads instead of cropping: give it or resize, not both", "letterbox")
    return Preprocess(
        size=(size[0], size[1]),
        resize=resize,
        layout=layout,
        color=color,
        scale=float(fields.get("scale", (int, float), 1.0 / 255.0)),
        mean=mean,
        std=std,
        letterbox=letterbox,
    )


def _postprocess(manifest: Path, table: dict) -> Postprocess:
    fields = Fields(manifest, "postprocess", table)
    fields.unknown({"softmax", "top_k"})
    top_k = fields.get("top_k", int, 5)
    if top_k < 1:
        fields.fail("must be at least 1", "top_k")
    return Postprocess(softmax=fields.get("softmax", bool, True), top_k=top_k)


def _variant(root: Path, manifest: Path, index: int, table: Any) -> Variant:
    fields = Fields(manifest, f"variant[{index}]", table)
    fields.unknown({"runtime", "precision", "files", "layout", "sha256"})
    runtime = fields.get("runtime", str, choices=RUNTIMES)
    precision = fields.get("precision", str, choices=PRECISIONS)
    names = fields.get("files", list)
    if not names or not all(isinstance(n, str) for n in names):
        fields.fail("must be a non-empty list of file names", "files")
    suffixes = RUNTIME_SUFFIXES[runtime]
    sealed = sealed_dir(root, f"{runtime}/{precision}")
    files, sealed_files = [], []
    for name in names:
        path = inside(root, manifest, f"variant[{index}].files", name)
        if path.suffix not in suffixes:
            fields.fail(f"{name!r} is not a {runtime} file ({' '.join(suffixes)})", "files")
        stored = sealed / path.relative_to(root) if sealed.is_dir() else path
        shown = repr(stored.relative_to(root).as_posix())
        if not stored.is_file():
            fields.fail(f"file {shown} does not exist", "files")
        if stored.stat().st_size == 0:
            fields.fail(f"file {shown} is empty", "files")
        files.append(path)
        sealed_files.append(stored)
    weights = weights_file(files[0])  # an OpenVINO .xml keeps its weights in a .bin
    if weights is not None and not any(f.suffix == weights.suffix for f in files):
        fields.fail(f"{names[0]!r} needs its weights file ({weights.name}) listed too", "files")
    sha256 = fields.get("sha256", dict, {})
    for name, expected in sha256.items():
        match = [f for f in files if f.name == name]
        if not match:
            fields.fail(f"names {name!r}, which is not among the variant's files", "sha256")
        if sealed.is_dir():  # checked on the plaintext, in memory, when it is opened
            continue
        if file_sha256(match[0]) != str(expected).lower():
            fields.fail(f"{name} does not match its SHA-256 (corrupt or altered file)", "sha256")
    return Variant(
        runtime=runtime,
        precision=precision,
        files=tuple(files),
        layout=fields.get("layout", str, None, choices=LAYOUTS),
        sha256=dict(sha256),
        sealed_files=tuple(sealed_files) if sealed.is_dir() else (),
    )
