"""Model packages (SPEC §3): a directory with ``model.toml``, labels and one file set per variant.

The schema is validated completely on load so that a broken package is refused before any
runtime sees it; every error names the file and the field, because on a device in a field the
error message is all an operator gets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent._toml import tomllib
from edgeagent.models.detection_head import DetectionHead

# Names, versions and the seal scheme live in the leaf the hub and fleet read; the reader
# re-exports them for the device-side modules that already import it.
from edgeagent.models.names import NAME_RE, TASK_NAMES, VERSION_RE
from edgeagent.models.names import SEAL_SCHEME as SEAL_SCHEME
from edgeagent.models.names import version_tuple as version_tuple
from edgeagent.runtimes.facts import RUNTIME_FACTS, RUNTIME_NAMES, weights_file
from edgeagent.sections import did_you_mean

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


class PackageError(ValueError):
    """A model package that cannot be used; the message names the file and the field."""


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
class ServingHints:
    """Per-model serving defaults; the daemon config may override them."""

    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    cache_size: int = 0  # result-cache entries; 0 disables the cache
    # The execution plan (edgeagent.engine.plan): "auto" measures instances × threads × batch
    # on the device; "fixed" serves instances × threads with max_batch_size as given.
    plan: str = "auto"
    instances: int | None = None  # execution instances (sessions); None = the plan's choice
    threads: int | None = None  # intra-op threads per instance; None = the plan's choice
    # Devices serving the model at once (hardware.spread): up to N, or those named; None =
    # [hardware] spread.
    spread: int | tuple[str, ...] | None = None
    # True: never sent to a peer (hardware.peers); a sealed model never is, whatever this says.
    local_only: bool = False


MAX_SPREAD = 16  # devices one model may be spread over


def spread_problem(value: int | Sequence[str]) -> str:
    """Why a ``spread`` value (a device count, or device names) is unusable; "" when fine."""
    if isinstance(value, bool):
        return "must be a number of devices or a list of device names, not true/false"
    if isinstance(value, int):
        return "" if 1 <= value <= MAX_SPREAD else f"must be between 1 and {MAX_SPREAD} devices"
    if not value or len(value) > MAX_SPREAD:
        return f"must name between 1 and {MAX_SPREAD} devices"
    if not all(isinstance(name, str) and name.strip() for name in value):
        return "device names must be non-empty strings (CPU, GPU0, NPU …)"
    if len(set(value)) != len(value):
        return "names a device twice"
    return ""


@dataclass(frozen=True)
class Variant:
    """One runnable file set: a runtime × precision, possibly with its own input layout."""

    runtime: str
    precision: str
    files: tuple[Path, ...]
    layout: str | None  # input layout of this file when it differs from the package's
    sha256: Mapping[str, str]
    # A sealed variant's encrypted files, one per entry of ``files`` (which are then absent:
    # the plaintext exists only in memory, see ``edgeagent.models.sealed``); () when plain.
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


class _Fields:
    """Typed accessors over one TOML table that report errors as ``file: section.key: problem``."""

    def __init__(self, source: Path, where: str, table: Any) -> None:
        self.source = source
        self.where = where
        if not isinstance(table, dict):
            self.fail(f"must be a table, got {type(table).__name__}")
        self.table: dict[str, Any] = table

    def fail(self, problem: str, key: str | None = None) -> PackageError:
        # The top-level table has no name of its own: its problems read "model.toml: problem".
        path = ".".join(part for part in (self.where, key) if part)
        raise PackageError(": ".join(part for part in (str(self.source), path, problem) if part))

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, choices=None):
        if key not in self.table:
            if default is ...:
                self.fail("missing required field", key)
            return default
        value = self.table[key]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            self.fail(f"must be {_kind_name(kind)}, got a boolean", key)
        if not isinstance(value, kind):
            self.fail(f"must be {_kind_name(kind)}, got {type(value).__name__} {value!r}", key)
        if choices is not None and value not in choices:
            self.fail(f"{value!r} is not one of {', '.join(map(str, choices))}", key)
        return value

    def unknown(self, allowed: set[str]) -> None:
        extra = sorted(set(self.table) - allowed)
        if extra:
            known = ", ".join(sorted(allowed))
            hint = did_you_mean(extra, sorted(allowed))
            self.fail(f"unknown field(s) {', '.join(extra)}{hint}; allowed: {known}")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


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

    top = _Fields(manifest, "", data)
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
    serving = _serving(manifest, top.get("serving", dict, {}))

    labels: tuple[str, ...] = ()
    labels_name = top.get("labels", str, None)
    if labels_name is not None:
        labels_path = _inside(root, manifest, "labels", labels_name)
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
        golden = _inside(root, manifest, "golden", golden_name)
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
        detection, anchors = _detection(root, manifest, top.get("detection", dict), outputs)
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
        key: _inside(root, manifest, key, name)
        for key, name in named.items()
        if isinstance(name, str)
    }


def _device_files(
    root: Path, manifest: Path, top: _Fields, named: dict[str, Path]
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
        path = _inside(root, manifest, "device_files", name)
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


def _inside(root: Path, manifest: Path, key: str, name: str) -> Path:
    """Resolve a file named by the package and refuse anything that escapes the directory."""
    path = (root / name).resolve()
    if root not in path.parents:
        raise PackageError(f"{manifest}: {key}: {name!r} points outside the package")
    return path


def _tensors(manifest: Path, key: str, tables: list) -> tuple[TensorSpec, ...]:
    if not tables:
        raise PackageError(f"{manifest}: {key}: at least one tensor is required")
    specs = []
    for index, table in enumerate(tables):
        fields = _Fields(manifest, f"{key}[{index}]", table)
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


def _floats(fields: _Fields, key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    values = fields.get(key, list, list(default))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        fields.fail("must be a list of numbers", key)
    return tuple(float(v) for v in values)


def _preprocess(
    manifest: Path, table: dict | None, inputs: tuple[TensorSpec, ...]
) -> Preprocess | None:
    if table is None:
        return None
    fields = _Fields(manifest, "preprocess", table)
    fields.unknown({"size", "resize", "layout", "color", "scale", "mean", "std", "letterbox"})
    size = fields.get("size", list)
    if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
        fields.fail("must be [height, width] in pixels", "size")
    color = fields.get("color", str, "RGB", choices=("RGB", "BGR", "L"))
    channels = 1 if color == "L" else 3
    mean = _floats(fields, "mean", (0.0,) * channels)
    std = _floats(fields, "std", (1.0,) * channels)
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
    fields = _Fields(manifest, "postprocess", table)
    fields.unknown({"softmax", "top_k"})
    top_k = fields.get("top_k", int, 5)
    if top_k < 1:
        fields.fail("must be at least 1", "top_k")
    return Postprocess(softmax=fields.get("softmax", bool, True), top_k=top_k)


def _serving(manifest: Path, table: dict) -> ServingHints:
    fields = _Fields(manifest, "serving", table)
    fields.unknown(
        {
            "max_batch_size",
            "max_queue_delay_ms",
            "cache_size",
            "plan",
            "instances",
            "threads",
            "spread",
            "local_only",
        }
    )
    spread = fields.get("spread", (int, list), None)
    if spread is not None and spread_problem(spread):
        fields.fail(spread_problem(spread), "spread")
    hints = ServingHints(
        max_batch_size=fields.get("max_batch_size", int, 8),
        max_queue_delay_ms=float(fields.get("max_queue_delay_ms", (int, float), 2.0)),
        cache_size=fields.get("cache_size", int, 0),
        plan=fields.get("plan", str, "auto", choices=("auto", "fixed")),
        instances=fields.get("instances", int, None),
        threads=fields.get("threads", int, None),
        spread=tuple(spread) if isinstance(spread, list) else spread,
        local_only=fields.get("local_only", bool, False),
    )
    for key in ("instances", "threads"):
        if getattr(hints, key) is not None and not 1 <= getattr(hints, key) <= 256:
            fields.fail("must be between 1 and 256", key)
    if hints.max_batch_size < 1:
        fields.fail("must be at least 1", "max_batch_size")
    if hints.max_queue_delay_ms < 0 or hints.cache_size < 0:
        fields.fail("must not be negative", "max_queue_delay_ms")
    return hints


def _variant(root: Path, manifest: Path, index: int, table: Any) -> Variant:
    fields = _Fields(manifest, f"variant[{index}]", table)
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
        path = _inside(root, manifest, f"variant[{index}].files", name)
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


def _detection(
    root: Path, manifest: Path, table: dict, outputs: tuple[TensorSpec, ...]
) -> tuple[DetectionHead, np.ndarray | None]:
    """The ``[detection]`` table: head style, thresholds, and the anchors of an SSD-style head
    (a ``.npy`` file in the package, or ``[detection.anchors]`` to generate them)."""
    fields = _Fields(manifest, "detection", table)
    fields.unknown(
        {
            "style",
            "box_format",
            "normalized",
            "objectness",
            "activation",
            "background",
            "variances",
            "first_class_id",
            "score_threshold",
            "iou_threshold",
            "max_detections",
            "anchors",
        }
    )
    variances = _floats(fields, "variances", (0.1, 0.2))
    if len(variances) != 2 or min(variances) <= 0:
        fields.fail("must be two positive numbers [centre, size]", "variances")
    head = DetectionHead(
        style=fields.get("style", str, "yolo", choices=("yolo", "ssd", "postprocessed")),
        box_format=fields.get("box_format", str, "cxcywh", choices=("cxcywh", "xyxy", "yxyx")),
        normalized=fields.get("normalized", bool, False),
        objectness=fields.get("objectness", bool, False),
        activation=fields.get("activation", str, "none", choices=("none", "sigmoid", "softmax")),
        background=fields.get("background", bool, False),
        variances=(variances[0], variances[1]),
        first_class_id=fields.get("first_class_id", int, 0),
        score_threshold=float(fields.get("score_threshold", (int, float), 0.25)),
        iou_threshold=float(fields.get("iou_threshold", (int, float), 0.45)),
        max_detections=fields.get("max_detections", int, 100),
    )
    for key in ("score_threshold", "iou_threshold"):
        if not 0 <= getattr(head, key) <= 1:
            fields.fail("must be between 0 and 1", key)
    if not 1 <= head.max_detections <= 10_000:
        fields.fail("must be 1..10000", "max_detections")
    if not 0 <= head.first_class_id <= 1:
        fields.fail("must be 0 or 1 (the class id of the first label)", "first_class_id")
    wanted = {"ssd": (2,), "postprocessed": (3, 4)}.get(head.style, (1,))
    if len(outputs) not in wanted:
        fields.fail(
            f"a {head.style}-style head has {' or '.join(map(str, wanted))} output(s), the "
            f"package declares {len(outputs)}",
            "style",
        )
    if head.style != "ssd":
        if "anchors" in fields.table:
            kind = "YOLO" if head.style == "yolo" else head.style
            fields.fail(f"a {kind}-style head has no anchors", "anchors")
        return head, None
    return head, _anchors(root, manifest, fields)


def _anchors(root: Path, manifest: Path, fields: _Fields) -> np.ndarray:
    # numpy is read here only: the rest of the reader (what the hub runs to sign a release)
    # works on plain values, and only an SSD head carries an array.
    import numpy as np

    from edgeagent.models.tasks.detection import ssd_anchors

    value = fields.get("anchors", (str, dict))
    if isinstance(value, str):
        path = _inside(root, manifest, "detection.anchors", value)
        try:
            anchors = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            fields.fail(f"cannot read {value!r} as a .npy array: {exc}", "anchors")
    else:
        generator = _Fields(manifest, "detection.anchors", value)
        generator.unknown({"feature_maps", "scales", "aspect_ratios"})
        maps = generator.get("feature_maps", list)
        if not maps or not all(isinstance(m, int) and 0 < m <= 1024 for m in maps):
            generator.fail("must be a list of feature-map sizes (1..1024)", "feature_maps")
        scales = _floats(generator, "scales", ())
        ratios = _floats(generator, "aspect_ratios", (1.0, 2.0, 0.5))
        try:
            anchors = ssd_anchors(maps, list(scales), ratios)
        except ValueError as exc:
            generator.fail(str(exc), "scales")
    if anchors.ndim != 2 or anchors.shape[1] != 4 or not np.all(np.isfinite(anchors)):
        fields.fail(
            f"anchors must be a finite [A, 4] array (cx, cy, w, h), got {anchors.shape}", "anchors"
        )
    return anchors.astype(np.float32)
