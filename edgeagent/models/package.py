"""Model packages (SPEC §3): a directory with ``model.toml``, labels and one file set per variant.

The schema is validated completely on load so that a broken package is refused before any
runtime sees it; every error names the file and the field, because on a device in a field the
error message is all an operator gets.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent._toml import tomllib
from edgeagent.models.capture_table import CaptureHints, read_capture
from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.detection_table import read_detection

# Names, versions and the seal scheme live in the leaf the hub and fleet read; the reader
# re-exports them for the device-side modules that already import it.
from edgeagent.models.names import NAME_RE, TASK_NAMES, TEXT_TASKS, VERSION_RE
from edgeagent.models.names import SEAL_SCHEME as SEAL_SCHEME
from edgeagent.models.names import version_tuple as version_tuple

# The error, the table accessors and the [serving] table have modules of their own; the reader
# re-exports what its importers name.
from edgeagent.models.sequence_table import SequenceSpec, read_sequence
from edgeagent.models.serving_hints import MAX_SPREAD as MAX_SPREAD
from edgeagent.models.serving_hints import ServingHints, read_serving
from edgeagent.models.serving_hints import spread_problem as spread_problem
from edgeagent.models.tensor_tables import DTYPES as DTYPES
from edgeagent.models.tensor_tables import LAYOUTS as LAYOUTS
from edgeagent.models.tensor_tables import (
    Postprocess,
    Preprocess,
    TensorSpec,
    read_postprocess,
    read_preprocess,
    read_tensors,
)
from edgeagent.models.toml_fields import Fields, PackageError, inside
from edgeagent.runtimes.facts import (
    GENERATIVE_RUNTIMES,
    RUNTIME_FACTS,
    RUNTIME_NAMES,
    weights_file,
)

if TYPE_CHECKING:
    import numpy as np

    from edgeagent.models.text_spec import TextSpec

RUNTIMES = RUNTIME_NAMES
PRECISIONS = ("fp32", "fp16", "int8")
# A language model's precision is its quantization's own name (q4_0, q4_k_m, int4 …).
TEXT_PRECISION_RE = re.compile(r"\A[a-z0-9][a-z0-9_]{0,15}\Z", re.ASCII)
TASKS = TASK_NAMES  # what the model computes: decides its golden record and health check
# Which file suffixes each runtime reads; a variant whose files do not fit is refused.
RUNTIME_SUFFIXES = {name: facts.suffixes for name, facts in RUNTIME_FACTS.items()}


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
    text: TextSpec | None = None  # a language model's [text] table (tasks TEXT_TASKS)
    capture: CaptureHints = field(default_factory=CaptureHints)  # [capture]: may it be sampled
    sequence: SequenceSpec | None = None  # a stateful model's [sequence] table

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
    if data.get("task") in TEXT_TASKS:
        return _load_text(root, manifest, top)
    task = top.get("task", str, "classification", choices=TASKS)  # before its tables' names
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
            "capture",
            "sequence",
        }
    )
    name, version = _identity(top)
    description = top.get("description", str, "")
    capture = read_capture(manifest, top.get("capture", dict, None))

    inputs = read_tensors(manifest, "inputs", top.get("inputs", list))
    outputs = read_tensors(manifest, "outputs", top.get("outputs", list))
    preprocess = read_preprocess(manifest, top.get("preprocess", dict, None), inputs)
    postprocess = read_postprocess(manifest, top.get("postprocess", dict, {}))
    serving = read_serving(manifest, top.get("serving", dict, {}))
    sequence = read_sequence(manifest, top.get("sequence", dict, None), inputs, outputs)

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
        if task == "classification" and not outputs[0].shape:
            top.fail(f"output {outputs[0].name!r} is a scalar: labels need a class axis", "labels")
        classes = outputs[0].shape[-1] if outputs[0].shape else 0
        if task == "classification" and classes > 0 and len(labels) != classes:
            top.fail(
                f"{labels_name} has {len(labels)} labels but output {outputs[0].name!r} "
                f"has {classes} classes",
                "labels",
            )

    golden = _golden(root, manifest, top)
    variants = _variants(root, manifest, top, text=False)
    logical_layout = inputs[0].layout or "NCHW"
    for index, variant in enumerate(variants):
        if logical_layout == "NHWC" and variant.layout == "NCHW":
            raise PackageError(
                f"{manifest}: variant[{index}].layout: an NCHW file cannot serve the NHWC input "
                f"{inputs[0].name!r} (the agent transposes NCHW requests to NHWC files only)"
            )

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
        capture=capture,
        sequence=sequence,
    )


def _identity(top: Fields) -> tuple[str, str]:
    """The package's name and version, checked."""
    name = top.get("name", str)
    if not NAME_RE.match(name):
        top.fail("must be 1-64 letters, digits, '_', '-' or '.'", "name")
    version = str(top.get("version", (int, str)))
    if not VERSION_RE.match(version):
        top.fail(f"{version!r} is not an integer or MAJOR.MINOR.PATCH", "version")
    return name, version


def _golden(root: Path, manifest: Path, top: Fields) -> Path | None:
    golden_name = top.get("golden", str, None)
    if golden_name is None:
        return None
    golden = inside(root, manifest, "golden", golden_name)
    if not golden.is_file():
        top.fail(f"file {golden_name!r} does not exist", "golden")
    return golden


def _load_text(root: Path, manifest: Path, top: Fields) -> ModelPackage:
    """A language model's package (models.text_spec): [text] and generative variants, no
    tensor tables."""
    from edgeagent.models.text_spec import TENSOR_ONLY, parse_text

    misplaced = [key for key in TENSOR_ONLY if key in top.table]
    if misplaced:
        top.fail(f"a {top.table['task']} package has no {', '.join(misplaced)} (tensor tables)")
    top.unknown(
        {"name", "version", "task", "description", "text", "variant", "golden", "device_files"}
    )
    name, version = _identity(top)
    named = _named_files(root, manifest, top.table)
    return ModelPackage(
        root=root,
        name=name,
        version=version,
        task=top.get("task", str, choices=TEXT_TASKS),
        description=top.get("description", str, ""),
        inputs=(),
        outputs=(),
        preprocess=None,
        postprocess=Postprocess(softmax=False, top_k=1),
        labels=(),
        variants=_variants(root, manifest, top, text=True),
        golden=_golden(root, manifest, top),
        device_files=_device_files(root, manifest, top, named),
        named_files=tuple(named.values()),
        text=parse_text(Fields(manifest, "text", top.get("text", dict))),
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


def _variants(root: Path, manifest: Path, top: Fields, *, text: bool) -> tuple[Variant, ...]:
    """The installed ``[[variant]]`` tables; a language model's only on generative runtimes,
    a tensor model's never."""
    tables = top.get("variant", list)
    if not tables:
        top.fail("at least one [[variant]] is required", "variant")
    tables = _installed_subset(root, tables)
    variants = tuple(_variant(root, manifest, i, table, text) for i, table in enumerate(tables))
    keys = [variant.key for variant in variants]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice:
        raise PackageError(f"{manifest}: variant: {twice} is declared twice")
    return variants


def _variant(root: Path, manifest: Path, index: int, table: Any, text: bool) -> Variant:
    fields = Fields(manifest, f"variant[{index}]", table)
    fields.unknown({"runtime", "precision", "files", "layout", "sha256"})
    runtime = fields.get("runtime", str, choices=RUNTIMES)
    if text != (runtime in GENERATIVE_RUNTIMES):
        kinds = "a language model" if runtime in GENERATIVE_RUNTIMES else "a tensor model"
        fields.fail(f"{runtime} runs {kinds}, not this package's task", "runtime")
    if text:
        precision = fields.get("precision", str)
        if not TEXT_PRECISION_RE.match(precision):
            fields.fail(
                f"{precision!r} is not a lower-case quantization name (q4_1, f16 …)", "precision"
            )
    else:
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
