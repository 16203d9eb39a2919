"""A TensorFlow SavedModel saved with its optimizer, packaged for inference only.

Spotify's Basic Pitch 0.4.0 wheel ships its note model as a SavedModel whose object graph
holds the optimizer's slot variables, which TensorFlow 2.16+'s object loader cannot rebuild
(``'_UserObject' object has no attribute 'add_slot'``), so tf2onnx's SavedModel path fails on
it. The packager loads its serving signature (the MetaGraph, as TensorFlow Serving does); the
package answers as the publisher's own TFLite conversion of the same network.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from edgeagent.cli import main
from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from tests.support.helpers import REPO

TF_PYTHON = REPO / ".venv-tf" / "bin" / "python"
MODELS = Path(os.environ.get("EDGEAGENT_THIRD_PARTY", REPO / "third-party-models"))
SAMPLES = 43844  # the model's window: 2 s of 22 050 Hz audio less its hop
# The signature's output names → the TFLite file's names for the same tensors.
TFLITE_NAMES = {
    "contour": "StatefulPartitionedCall:0",
    "note": "StatefulPartitionedCall:1",
    "onset": "StatefulPartitionedCall:2",
}


def _clips() -> np.ndarray:
    t = np.arange(SAMPLES) / 22050
    chords = [(220.0, 277.2, 329.6), (261.6, 329.6, 392.0)]
    audio = [sum(np.sin(2 * np.pi * f * t) for f in chord) / 4 for chord in chords]
    return np.stack(audio).astype(np.float32)[..., None]


def _tflite(model: Path, clip: np.ndarray) -> dict[str, np.ndarray]:
    from ai_edge_litert import interpreter

    runner = interpreter.Interpreter(model_path=str(model))
    runner.allocate_tensors()
    runner.set_tensor(runner.get_input_details()[0]["index"], clip)
    runner.invoke()
    return {d["name"]: runner.get_tensor(d["index"]) for d in runner.get_output_details()}


@pytest.mark.slow  # two TensorFlow processes (the freeze, tf2onnx): ~30 s
def test_savedmodel_with_optimizer_slots_packages_from_its_signature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not TF_PYTHON.exists():
        pytest.skip(f"{TF_PYTHON} missing: TensorFlow sources need scripts/setup.sh's .venv-tf")
    saved = MODELS / "basic_pitch" / "nmp"
    if not (saved / "saved_model.pb").is_file():
        pytest.fail(f"{saved} not found: run scripts/fetch_models.py")
    clips = _clips()
    np.savez(tmp_path / "audio.npz", input_2=clips)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(
            [
                *("package", str(saved), "--name", "basic_pitch", "--task", "tensor"),
                *("--variants", "graph", "--heldout", str(tmp_path / "audio.npz")),
                *("--threads", "1", "--timing-runs", "3", "--json", "--out", str(tmp_path / "pkg")),
            ]
        )
    err = capsys.readouterr().err
    assert code == 0, err
    assert "nmp: its serving signature, for inference (variables frozen)" in err
    report = json.loads(stdout.getvalue())
    assert [v["kept"] for v in report["variants"]] == [True]
    package = load_package(tmp_path / "pkg")
    assert [(t.name, t.shape) for t in package.outputs] == [
        ("contour", (-1, 172, 264)),
        ("note", (-1, 172, 88)),
        ("onset", (-1, 172, 88)),
    ]
    variant = package.variants[0]
    session = open_variant(package, variant.runtime, variant.precision, threads=1)
    for clip in clips:
        served = session.run({"input_2": clip[None]})
        own = _tflite(MODELS / "basic_pitch" / "nmp.tflite", clip[None])
        for name, tflite_name in TFLITE_NAMES.items():
            np.testing.assert_allclose(served[name], own[tflite_name], rtol=1e-4, atol=1e-4)
