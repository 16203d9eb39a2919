"""The one model.toml writer (issue 22 §5): what it writes, load_package reads back identically;
what TOML cannot hold as written is refused naming the key; nothing else writes model.toml."""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeagent._toml import tomllib
from edgeagent.models import manifest_writer
from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.manifest_writer import Manifest, VariantFiles, dumps, write_manifest
from edgeagent.models.package import (
    DTYPES,
    LAYOUTS,
    PackageError,
    Postprocess,
    Preprocess,
    ServingHints,
    TensorSpec,
    file_sha256,
)

REPO = Path(__file__).resolve().parents[2]
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

# TOML values as the stdlib reader returns them: the serializer must give each back unchanged.
scalars = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()  # hypothesis's text never holds lone surrogates
)
keys = st.text(max_size=12)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
tables = st.dictionaries(
    keys,
    values
    | st.dictionaries(keys, values, max_size=4)
    | st.lists(st.dictionaries(keys, values, max_size=3), min_size=1, max_size=3),
    max_size=6,
)


@PROPERTY
@given(table=tables)
def test_what_dumps_writes_the_stdlib_reader_reads_back_unchanged(table: dict) -> None:
    assert tomllib.loads(dumps(table)) == table


names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", fullmatch=True)
versions = st.from_regex(r"[0-9]{1,9}(\.[0-9]{1,9}){0,2}", fullmatch=True)
dims = st.integers(1, 2**31) | st.just(-1)
tensors = st.builds(
    TensorSpec,
    name=st.text(min_size=1, max_size=20),
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(dims, min_size=1, max_size=5).map(tuple),
    layout=st.none() | st.sampled_from(LAYOUTS),
)
finite = st.floats(-1e6, 1e6, allow_nan=False)
positive = st.floats(1e-6, 1e6)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    """Any package the reader accepts: one input of image rank when there is a preprocess."""
    image = draw(st.booleans())
    inputs = draw(st.lists(tensors, min_size=1, max_size=3))
    color = draw(st.sampled_from(["RGB", "BGR", "L"]))
    channels = 1 if color == "L" else 3
    preprocess = None
    if image:
        size = draw(st.tuples(st.integers(1, 4096), st.integers(1, 4096)))
        letterbox = draw(st.booleans())
        resize = None if letterbox else draw(st.none() | st.integers(min(size), 8192))
        preprocess = Preprocess(
            size=size,
            resize=resize,
            layout=inputs[0].layout or "NCHW",
            color=color,
            scale=draw(finite),
            mean=tuple(draw(st.lists(finite, min_size=channels, max_size=channels))),
            std=tuple(draw(st.lists(positive, min_size=channels, max_size=channels))),
            letterbox=letterbox,
        )
    return Manifest(
        name=draw(names),
        version=draw(versions),
        task=draw(st.sampled_from(["classification", "segmentation", "tensor"])),
        description=draw(st.text(max_size=40)),
        inputs=tuple(inputs),
        outputs=tuple(draw(st.lists(tensors, min_size=1, max_size=3))),
        preprocess=preprocess,
        postprocess=draw(st.none() | st.builds(Postprocess, st.booleans(), st.integers(1, 1000))),
        serving=draw(
            st.none()
            | st.builds(ServingHints, st.integers(1, 1024), positive, st.integers(0, 10_000))
        ),
        variants=(
            VariantFiles("onnxruntime", "fp32", ("model.onnx",)),
            VariantFiles(
                "openvino", "int8", ("m.xml", "m.bin"), draw(st.sampled_from([None, "NHWC"]))
            ),
        ),
    )


def _package_dir(root: Path) -> Path:
    for name in ("model.onnx", "m.xml", "m.bin"):
        (root / name).write_bytes(name.encode())
    return root


def _expected(manifest: Manifest) -> dict:
    """What load_package answers for ``manifest``: its fields, the reader's defaults for None."""
    return {
        "name": manifest.name,
        "version": manifest.version,
        "task": manifest.task,
        "description": manifest.description,
        "inputs": manifest.inputs,
        "outputs": manifest.outputs,
        "preprocess": manifest.preprocess,
        "postprocess": manifest.postprocess or Postprocess(softmax=True, top_k=5),
        "serving": manifest.serving or ServingHints(),
    }


@PROPERTY
@given(manifest=manifests())
def test_load_package_reads_back_what_write_manifest_wrote(manifest: Manifest) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = _package_dir(Path(tmp))
        package = write_manifest(root, manifest)
        read = {key: getattr(package, key) for key in _expected(manifest)}
        assert read == _expected(manifest)
        variants = [(v.runtime, v.precision, tuple(f.name for f in v.files), v.layout)
                    for v in package.variants]  # fmt: skip
        assert variants == [(v.runtime, v.precision, v.files, v.layout) for v in manifest.variants]
        assert all(
            digest == file_sha256(root / name)
            for variant in package.variants
            for name, digest in variant.sha256.items()
        )
        assert sum(len(v.sha256) for v in package.variants) == 3  # every file hashed


def test_a_detector_round_trips_with_its_head_and_anchors(tmp_path: Path) -> None:
    np.save(tmp_path / "anchors.npy", np.full((6, 4), 0.5, np.float32))
    head = DetectionHead(style="ssd", activation="softmax", background=True, variances=(0.2, 0.3))
    manifest = Manifest(
        name="ssd",
        version="2.0.1",
        task="detection",
        inputs=(TensorSpec("image", "uint8", (-1, 64, 64, 3), "NHWC"),),
        outputs=(
            TensorSpec("boxes", "float32", (-1, 6, 4)),
            TensorSpec("scores", "float32", (-1, 6, 3)),
        ),
        detection=head,
        anchors="anchors.npy",
        variants=(VariantFiles("onnxruntime", "fp32", ("model.onnx",)),),
    )
    package = write_manifest(_package_dir(tmp_path), manifest)
    assert package.detection == head
    assert package.anchors is not None and package.anchors.shape == (6, 4)


def test_a_postprocessed_detector_round_trips_with_its_first_class_id(tmp_path: Path) -> None:
    head = DetectionHead(
        style="postprocessed", box_format="yxyx", normalized=True, first_class_id=1
    )
    rows = [TensorSpec(n, "float32", (-1, 10)) for n in ("classes", "scores")]
    manifest = Manifest(
        name="tf-ssd",
        version="1.0.0",
        task="detection",
        inputs=(TensorSpec("image", "float32", (-1, 64, 64, 3), "NHWC"),),
        outputs=(TensorSpec("boxes", "float32", (-1, 10, 4)), *rows),
        detection=head,
        variants=(VariantFiles("onnxruntime", "fp32", ("model.onnx",)),),
    )
    package = write_manifest(_package_dir(tmp_path), manifest)
    assert package.detection == head
    assert "first_class_id = 1" in (tmp_path / "model.toml").read_text(encoding="utf-8")


def test_a_manifest_the_reader_refuses_is_refused_when_written(tmp_path: Path) -> None:
    manifest = Manifest(
        name="ok",
        version="1",
        inputs=(TensorSpec("x", "float32", (-1, 3)),),
        outputs=(TensorSpec("y", "float32", (-1, 2)),),
        variants=(VariantFiles("litert", "fp32", ("model.onnx",)),),  # not a LiteRT file
    )
    with pytest.raises(PackageError, match=r"variant\[0\]\.files: 'model.onnx' is not a litert"):
        write_manifest(_package_dir(tmp_path), manifest)


@pytest.mark.parametrize(
    ("table", "error", "message"),
    [
        ({"scale": math.nan}, ValueError, "scale: nan is not a finite number"),
        ({"serving": {"delay": math.inf}}, ValueError, "serving.delay: inf is not a finite"),
        ({"shape": [1, 2**63]}, ValueError, r"shape\[1\]: 9223372036854775808 does not fit"),
        ({"name": "a\ud800b"}, ValueError, "name: a lone surrogate"),
        ({"variant": [{"files": b"x.onnx"}]}, TypeError, "variant.files: cannot write bytes"),
        ({"labels": object()}, TypeError, "labels: cannot write object"),
        ({"sha256": {1: "x"}}, TypeError, "keys are strings, got int 1"),
    ],
)
def test_what_toml_cannot_hold_is_refused_naming_the_key(
    table: dict, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        dumps(table)


def test_numpy_numbers_are_written_as_plain_toml() -> None:
    """numpy's float64 is a float whose repr is ``np.float64(0.5)``: not TOML."""
    assert tomllib.loads(dumps({"scale": np.float64(0.5)})) == {"scale": 0.5}
    with pytest.raises(TypeError, match="size: cannot write int64"):
        dumps({"size": np.int64(8)})


def test_hostile_strings_stay_one_string() -> None:
    """Quotes, newlines, control characters and a fake table header stay inside the value."""
    hostile = 'x"\n[[variant]]\nruntime = "litert"\\\x00\x7f\u2028é😀'
    text = dumps({"description": hostile, "name": "n"})
    assert text.count("\n") == 2 and "[[variant]]\n" not in text
    assert tomllib.loads(text) == {"description": hostile, "name": "n"}


# Where a model.toml is written: a write/open call on a line that names the file.
WRITES = re.compile(
    r"(model\.toml|MANIFEST\b).*(\.write_text\(|\.write_bytes\(|\.open\(\s*[\"'][wax])"
)
# Producers are the agent, its scripts, devtools and test support; test modules themselves write
# broken manifests on purpose (the reader's own tests).
PRODUCERS = ("edgeagent", "scripts", "devtools", "tests/support")


def test_manifest_writer_is_the_only_producer_that_writes_model_toml() -> None:
    writers = {
        path.relative_to(REPO).as_posix()
        for top in PRODUCERS
        for path in (REPO / top).rglob("*.py")
        if WRITES.search(path.read_text(encoding="utf-8"))
        or re.search(r"^\s*(import|from) tomli_w\b", path.read_text(encoding="utf-8"), re.M)
    }
    assert writers == {"edgeagent/models/manifest_writer.py"}
    assert manifest_writer.MANIFEST == "model.toml"
