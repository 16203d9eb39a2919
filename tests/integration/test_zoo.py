"""The model zoo through the agent's own interfaces: every package × runtime × precision.

Needs the built zoo (``scripts/build_models.py``; the test command builds it first), found via
``EDGEAGENT_ZOO`` (default ``<repo>/zoo``). Torch is never imported here: the packages are
loaded with ``load_package`` and run through the runtime plugins, as the daemon does. A missing
zoo is a failure, not a skip — these tests are how the build is proven.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from edgeagent.models.package import ModelPackage, load_package
from edgeagent.models.preprocess import preprocess_image, resize_and_crop, to_tensor
from edgeagent.models.session import load_request
from edgeagent.runtimes import Session, get_runtime
from edgeagent.updates.settings import UpdateSettings

REPO = Path(__file__).resolve().parents[2]
ZOO = Path(os.environ.get("EDGEAGENT_ZOO", REPO / "zoo"))
BUILD_PYTHON = Path(os.environ.get("EDGEAGENT_BUILD_PYTHON", REPO / ".venv-build/bin/python"))
IMAGENET_MODELS = ("mobilenet_v2", "mobilenet_v3_small", "mobilevit_xxs")
MODELS = (*IMAGENET_MODELS, "digits_mnv3")
RUNTIMES = ("onnxruntime", "litert", "openvino")
PRECISIONS = ("fp32", "int8")
PHOTOS = ("china.jpg", "flower.png", "scene.jpg")

# FP32 on the three runtimes is the same float graph: differences are rounding only, stated
# relative to the largest logit of the reference (ONNX) output.
FP32_REL_TOLERANCE = 1e-3
# INT8 against FP32 on the untrained ImageNet models (seeded weights, not trained): their
# logits are nearly flat (the two best classes of an input often differ by 0.003-0.09), so
# which class wins depends on the last bit of every kernel's rounding. Top-1 agreement with
# FP32 over the 60 photo crops measured 0.52-0.78 on one build (AVX-512 VNNI), 0.55-0.73 on
# another, and the issue saw 0.583 on an AVX2-only EPYC against a bound of 0.6: a bound on it
# is a coin toss between CPU classes, and is no accuracy claim anyway (the trained digits and
# detector models below make those). What a quantised variant must still show on any kernel
# is that its answers follow the input, which a broken variant (wrong scales, a swapped
# layout, a constant or shuffled output) does not:
# - the centred logit correlation (each input's logits minus the set's mean FP32 logits, so
#   the large input-independent part is removed) is the input-dependent signal: 0.89-0.96 on
#   every runtime, AVX-512 VNNI and AVX2 alike (onnxruntime under qemu -cpu EPYC-Rome, AVX2
#   without VNNI: 0.91 / 0.96; mobilevit_xxs crashes the emulator); the answers of the wrong
#   inputs score -0.14 to 0.16 (the control below). Kernel rounding moves it by hundredths;
#   0.75 lies between the two;
# - top-1 agreement must beat what answering the set's commonest FP32 class for every input
#   scores (0.22-0.33 here): a constant model cannot, any working kernel does (≥ 0.52);
# - FP32's answer among the INT8's best five: 0.83-0.98 measured, 0.08-0.32 for the
#   wrong input's answers: 0.50 lies between.
# The control applies the same bounds to each variant's answers paired with the wrong inputs,
# so the test proves on every machine that they can fail.
INT8_MIN_CENTRED_CORRELATION = 0.75
INT8_MIN_TOP5_RECALL = 0.5
GOLDEN_TOP_K = UpdateSettings().golden_top_k  # what the updater's health check allows
DIGITS_MIN_FP32_ACCURACY = 0.95  # it is really trained: well above chance (0.10)
DIGITS_MAX_INT8_LOSS = 0.01  # INT8 within 1 point of FP32 on every runtime


def zoo_package(name: str) -> ModelPackage:
    directory = ZOO / name
    if not (directory / "model.toml").is_file():
        pytest.fail(
            f"model zoo package {directory} is missing: build the zoo first with "
            f"`.venv-build/bin/python scripts/build_models.py --out {ZOO}` "
            "(or point EDGEAGENT_ZOO at a built zoo)"
        )
    return load_package(directory)


def open_session(package: ModelPackage, runtime: str, precision: str) -> Session:
    variant = package.variant(runtime, precision)
    assert variant is not None, f"{package.name} has no {runtime}/{precision} variant"
    return get_runtime(runtime).load(load_request(package, variant))


def run(package: ModelPackage, runtime: str, precision: str, inputs: np.ndarray) -> np.ndarray:
    session = open_session(package, runtime, precision)
    try:
        name = package.inputs[0].name
        out = session.run({name: inputs})[package.outputs[0].name]
    finally:
        session.close()
    return np.asarray(out)


def photo_crops(package: ModelPackage) -> np.ndarray:
    """The fixed input set: a 3×3 grid of half-size crops plus the whole frame of each sample
    photo, each also mirrored, preprocessed by the agent's own pipeline (60 inputs)."""
    spec = package.preprocess
    assert spec is not None
    tensors = []
    for photo in PHOTOS:
        image = Image.open(ZOO / "samples" / photo).convert("RGB")
        width, height = image.size
        boxes = [(0, 0, width, height)]
        for row in range(3):
            for col in range(3):
                left, top = col * width // 4, row * height // 4
                boxes.append((left, top, left + width // 2, top + height // 2))
        for box in boxes:
            crop = image.crop(box)
            for view in (crop, ImageOps.mirror(crop)):
                tensors.append(to_tensor(resize_and_crop(view, spec), spec))
    return np.concatenate(tensors)


@pytest.fixture(scope="module")
def packages() -> dict[str, ModelPackage]:
    return {name: zoo_package(name) for name in MODELS}


@pytest.fixture(scope="module")
def fixed_inputs(packages) -> dict[str, np.ndarray]:
    inputs = {name: photo_crops(packages[name]) for name in IMAGENET_MODELS}
    with np.load(packages["digits_mnv3"].root / "heldout.npz") as heldout:
        inputs["digits_mnv3"] = heldout["inputs"]
    return inputs


@pytest.fixture(scope="module")
def fp32_reference(packages, fixed_inputs) -> dict[str, np.ndarray]:
    """FP32 ONNX logits on the fixed inputs: what every other variant is compared with."""
    return {name: run(packages[name], "onnxruntime", "fp32", fixed_inputs[name]) for name in MODELS}


def test_every_package_is_complete(packages):
    for name, package in packages.items():
        keys = {variant.key for variant in package.variants}
        assert keys == {f"{r}/{p}" for r in RUNTIMES for p in PRECISIONS}, name
        classes = 10 if name == "digits_mnv3" else 1000
        assert package.outputs[0].shape == (-1, classes)
        assert len(package.labels) == classes
        assert package.inputs[0].shape[0] == -1 and package.inputs[0].layout == "NCHW"
        assert package.postprocess.softmax
        for variant in package.variants:
            assert set(variant.sha256) == {f.name for f in variant.files}, variant.key
            expected = "NHWC" if variant.runtime == "litert" else None
            assert variant.layout == expected, variant.key
        with np.load(package.golden) as golden:
            assert golden["inputs"].dtype == np.float32
            assert golden["inputs"].shape[1:] == package.inputs[0].shape[1:]
            assert golden["top1"].shape == (len(golden["inputs"]),)
    assert packages["mobilenet_v2"].labels[:2] == ("tench", "goldfish")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", MODELS)
def test_variant_loads_and_runs_a_batch(packages, name, runtime, precision):
    """Each variant runs the golden batch (batch 4, more than the TFLite files' own batch of 1)
    and passes the check the updater makes with it. The build picks golden inputs that every
    variant classifies like FP32 on the building CPU, the clearest first; on the untrained
    models the clearest margin is still 0.003-0.09 between the two best logits, the size of an
    INT8 kernel's rounding, so on another CPU class INT8 may swap them. The updater's check
    allows that (``[updates] golden_top_k``, default 5), and so does this test: exact top-1
    for FP32 (the same float graph) and for the trained digits, the top-k rule elsewhere."""
    package = packages[name]
    with np.load(package.golden) as golden:
        inputs, top1 = golden["inputs"], golden["top1"]
    logits = run(package, runtime, precision, inputs)
    assert logits.shape == (len(inputs), package.outputs[0].shape[1])
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    if precision == "fp32" or name not in IMAGENET_MODELS:
        np.testing.assert_array_equal(logits.argmax(1), top1)
    else:
        best = np.argsort(-logits, axis=1)[:, :GOLDEN_TOP_K]
        assert all(t in row for t, row in zip(top1, best, strict=True)), (top1, best)


def test_onnx_files_have_a_dynamic_batch(packages):
    for name in MODELS:
        for precision in PRECISIONS:
            session = open_session(packages[name], "onnxruntime", precision)
            try:
                assert session.inputs[0].shape[0] == -1, (name, precision)
            finally:
                session.close()


@pytest.mark.parametrize("runtime", ["litert", "openvino"])
@pytest.mark.parametrize("name", MODELS)
def test_fp32_runtimes_agree(packages, fixed_inputs, fp32_reference, name, runtime):
    reference = fp32_reference[name]
    logits = run(packages[name], runtime, "fp32", fixed_inputs[name])
    tolerance = FP32_REL_TOLERANCE * np.abs(reference).max()
    worst = np.abs(logits - reference).max()
    assert worst <= tolerance, f"{name} {runtime} fp32 differs by {worst:.3g} > {tolerance:.3g}"
    np.testing.assert_array_equal(logits.argmax(1), reference.argmax(1))


def centred_correlation(reference: np.ndarray, logits: np.ndarray) -> float:
    """Mean per-input correlation of the logits after removing the set's mean FP32 logits."""
    mean = reference.mean(axis=0)
    pairs = zip(reference - mean, logits - mean, strict=True)
    return float(np.mean([np.corrcoef(a, b)[0, 1] for a, b in pairs]))


def int8_problems(reference: np.ndarray, logits: np.ndarray) -> list[str]:
    """What shows ``logits`` (INT8) do not follow the inputs ``reference`` (FP32) answered."""
    expected = reference.argmax(1)
    agreement = float((logits.argmax(1) == expected).mean())
    majority = float(np.bincount(expected).max() / len(expected))
    top5 = np.argsort(-logits, axis=1)[:, :5]
    recall = float(np.mean([e in row for e, row in zip(expected, top5, strict=True)]))
    correlation = centred_correlation(reference, logits)
    problems = []
    if correlation < INT8_MIN_CENTRED_CORRELATION:
        problems.append(f"centred correlation {correlation:.3f} < {INT8_MIN_CENTRED_CORRELATION}")
    if agreement <= majority:
        problems.append(f"top-1 agreement {agreement:.3f} <= the commonest class's {majority:.3f}")
    if recall < INT8_MIN_TOP5_RECALL:
        problems.append(f"top-5 recall {recall:.3f} < {INT8_MIN_TOP5_RECALL}")
    return problems


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", IMAGENET_MODELS)
def test_int8_follows_the_input_like_fp32(packages, fixed_inputs, fp32_reference, name, runtime):
    reference = fp32_reference[name]
    logits = run(packages[name], runtime, "int8", fixed_inputs[name])
    assert int8_problems(reference, logits) == [], f"{name} {runtime} int8 vs fp32"
    # The control: the same answers, each paired with another input, must fail the bounds.
    shuffled = np.roll(logits, len(logits) // 3, axis=0)
    assert int8_problems(reference, shuffled), f"{name} {runtime}: the bounds cannot fail"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_digits_int8_accuracy_within_one_point_of_fp32(packages, runtime):
    package = packages["digits_mnv3"]
    with np.load(package.root / "heldout.npz") as heldout:
        inputs, labels = heldout["inputs"], heldout["labels"]
    fp32 = float((run(package, runtime, "fp32", inputs).argmax(1) == labels).mean())
    int8 = float((run(package, runtime, "int8", inputs).argmax(1) == labels).mean())
    assert fp32 >= DIGITS_MIN_FP32_ACCURACY, f"{runtime} fp32 accuracy {fp32:.4f}"
    assert int8 >= fp32 - DIGITS_MAX_INT8_LOSS, f"{runtime}: int8 {int8:.4f} vs fp32 {fp32:.4f}"
    stored = json.loads((package.root / "accuracy.json").read_text())["accuracy"][runtime]
    assert stored["fp32"] == pytest.approx(fp32, abs=0.003)  # the build measured the same


@pytest.mark.parametrize("digit", [0, 3, 7])
def test_digit_samples_are_classified_through_the_agent_pipeline(packages, digit):
    """Sample file → the agent's decode/resize/normalise → INT8 model → the right digit."""
    package = packages["digits_mnv3"]
    assert package.preprocess is not None
    [sample] = (ZOO / "samples").glob(f"digit_{digit}.*")
    tensor = preprocess_image(sample.read_bytes(), package.preprocess)
    for runtime in RUNTIMES:
        logits = run(package, runtime, "int8", tensor)
        assert package.labels[int(logits.argmax())] == str(digit), runtime


def test_samples_hold_jpeg_and_png_photos_and_digits():
    formats = {}
    for path in sorted((ZOO / "samples").iterdir()):
        if path.suffix in (".jpg", ".png"):
            with Image.open(path) as image:
                formats[path.name] = (image.format, image.size)
    assert {f for f, _ in formats.values()} == {"JPEG", "PNG"}
    assert formats["scene.jpg"] == ("JPEG", (320, 240))
    assert {"china.jpg", "flower.png", "digit_0.png", "digit_3.jpg"} <= set(formats)


def build(out: Path, *args: str) -> subprocess.CompletedProcess:
    if not BUILD_PYTHON.is_file():
        pytest.skip(f"the model-building venv {BUILD_PYTHON} is not installed here")
    command = [str(BUILD_PYTHON), str(REPO / "scripts/build_models.py"), "--out", str(out)]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Iterator[tuple[Path, dict]]:
    """mobilenet_v3_small rebuilt from scratch (ONNX only, to stay fast) into a temp zoo."""
    out = tmp_path_factory.mktemp("zoo")
    result = build(out, "--only", "mobilenet_v3_small", "--formats", "onnx", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    yield out, json.loads(result.stdout)


@pytest.mark.slow
def test_same_seed_rebuilds_the_same_model_outputs(packages, rebuilt):
    out, summary = rebuilt
    [entry] = [e for e in summary["packages"] if e["name"] == "mobilenet_v3_small"]
    assert entry["status"] == "built"
    again = load_package(out / "mobilenet_v3_small")
    with np.load(packages["mobilenet_v3_small"].golden) as golden:
        inputs = golden["inputs"]
    original = run(packages["mobilenet_v3_small"], "onnxruntime", "fp32", inputs)
    np.testing.assert_allclose(run(again, "onnxruntime", "fp32", inputs), original, atol=1e-6)
    # The INT8 calibration too. Its activation ranges come from FP32 runs of the calibration
    # set on the building CPU, whose kernels round differently from another CPU class's, so
    # the zoo may have been calibrated elsewhere: the quantised weights must be identical,
    # every scale equal to within that rounding, and what is rounded after dividing by an
    # activation's scale (a zero point, an int32 bias) within one step of it.
    original_file, rebuilt_file = (
        package.root / package.variant("onnxruntime", "int8").files[0].name  # type: ignore[union-attr]
        for package in (packages["mobilenet_v3_small"], again)
    )
    original_tensors, rebuilt_tensors = map(onnx_initializers, (original_file, rebuilt_file))
    assert original_tensors.keys() == rebuilt_tensors.keys()
    for name, tensor in original_tensors.items():
        other = rebuilt_tensors[name]
        assert other.dtype == tensor.dtype and other.shape == tensor.shape, name
        if tensor.dtype in (np.int8, np.int64) or (tensor.dtype == np.uint8 and tensor.size > 1):
            np.testing.assert_array_equal(other, tensor, err_msg=name)  # weights, shapes
        elif np.issubdtype(tensor.dtype, np.integer):  # zero points, int32 biases
            steps = np.abs(other.astype(np.int64) - tensor.astype(np.int64))
            assert (steps <= 1 + np.abs(tensor.astype(np.int64)) * 1e-4).all(), name
        else:
            np.testing.assert_allclose(other, tensor, rtol=1e-4, atol=1e-7, err_msg=name)


def onnx_initializers(path: Path) -> dict[str, np.ndarray]:
    """Every constant tensor of an ONNX file, by name."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}


@pytest.mark.slow
def test_second_build_is_skipped_by_its_build_key(rebuilt):
    out, _ = rebuilt
    result = build(out, "--only", "mobilenet_v3_small", "--formats", "onnx", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = {e["name"]: e["status"] for e in json.loads(result.stdout)["packages"]}
    assert statuses == {"samples": "cached", "mobilenet_v3_small": "cached"}
    assert "up to date" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--only", "resnet50"), "invalid choice: 'resnet50'"),
        (("--formats", "tflite"), "--formats 'tflite'"),
    ],
)
def test_build_refuses_bad_arguments(tmp_path, args, message):
    result = build(tmp_path, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not any(tmp_path.iterdir()), "nothing is written for a refused command"
