"""Models a user brings that are not one float image in, class scores out: fetched from wheels
by scripts/fetch_models.py, packaged with ``edgeagent package``, served, and answered as their
own code or runtime answers.

- Magika 1.0.3's byte classifier (int32 input, fed from an ``.npz`` keyed by input name):
  served over v2 with the labels Magika's own package gives, on files of many types.
- PaddleOCR's direction classifier with its width left open (``--input-shape x=-1,3,48,-1``):
  a model.toml its reader accepts, served at other widths; and packaged at a fixed size with
  ``--resize-filter lanczos``, served preprocessing resizing as the option says.
- openWakeWord's melspectrogram (audio, open sample count): v2 carries the open shape, and
  the output shapes are what the model answered, not the file's ``[?, 1, ?, 32]``.
- openWakeWord's speech embedding (96 wide, no labels): an embedding (``tensor``), not 96
  unnamed classes.
- Pipecat's Smart Turn v3.2, which exists only as an int8 ONNX: its own reference, served as
  its own pipeline answers (its Whisper features, its probability).
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import io
import json
import sys
import tarfile
import wave
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edgeagent.api.client import AgentClient
from edgeagent.cli import main
from edgeagent.models.package import load_package
from tests.support.http_agent import AgentServer
from tests.support.third_party import MODELS, package, sample_photos

MAGIKA_WHEEL = "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl"
SMART_TURN = "smart-turn-v3.2-cpu.onnx"
NEEDED = (
    MAGIKA_WHEEL,
    "oww_melspectrogram.onnx",
    "oww_embedding_model.onnx",
    "ppocr_cls.onnx",
    SMART_TURN,
    "smart_turn_whisper_features.py",
)
RATE = 16000
CPU = ["CPUExecutionProvider"]
FAST = ("--timing-runs", "3")  # latency is not what these tests look at


@pytest.fixture(scope="module")
def models() -> Path:
    missing = [name for name in NEEDED if not (MODELS / name).is_file()]
    if missing:
        pytest.fail(
            f"third-party models {', '.join(missing)} not found in {MODELS}: run "
            "scripts/setup.sh (it runs scripts/fetch_models.py)"
        )
    return MODELS


def _sample_files(root: Path) -> list[Path]:
    """Files of many types, written by the standard library and Pillow."""
    from PIL import Image

    root.mkdir()
    texts = {
        "script.py": "import sys\n\n\ndef main() -> int:\n    print(sys.argv)\n    return 0\n" * 8,
        "data.json": json.dumps({"rows": [{"id": i, "name": f"n{i}"} for i in range(40)]}),
        "page.html": "<!DOCTYPE html>\n<html><head><title>t</title></head><body>"
        + "<p>paragraph</p>\n" * 30
        + "</body></html>\n",
        "table.csv": "id,name,price\n" + "".join(f"{i},item{i},{i * 1.5}\n" for i in range(60)),
        "doc.xml": '<?xml version="1.0"?>\n<root>'
        + "".join(f"<item id='{i}'>v{i}</item>\n" for i in range(40))
        + "</root>\n",
        "notes.md": "# Title\n\nSome *markdown* text with a [link](https://example.org).\n\n"
        + "- item\n" * 20,
        "run.sh": '#!/bin/sh\nset -eu\nfor f in *.txt; do\n  echo "$f"\ndone\n' * 6,
        "main.c": '#include <stdio.h>\n\nint main(void) {\n    printf("hello\\n");\n'
        "    return 0;\n}\n" * 6,
        "settings.ini": "[server]\nhost = localhost\nport = 8080\n\n[log]\nlevel = info\n" * 5,
        "config.yaml": "server:\n  host: localhost\n  port: 8080\nitems:\n"
        + "".join(f"  - name: item{i}\n    value: {i}\n" for i in range(20)),
        "image.svg": '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
        + '<rect x="1" y="1" width="5" height="5" fill="red"/>\n' * 20
        + "</svg>\n",
        "app.js": "function add(a, b) {\n  return a + b;\n}\nconsole.log(add(1, 2));\n" * 8,
        "style.css": "body {\n  margin: 0;\n  color: #333;\n}\n.box { padding: 4px; }\n" * 8,
        "query.sql": "SELECT id, name FROM users WHERE age > 30 ORDER BY name;\n"
        "INSERT INTO users (id, name) VALUES (1, 'a');\n" * 8,
        "letter.rtf": "{\\rtf1\\ansi\\deff0 {\\fonttbl {\\f0 Times;}}\\f0\\fs24 Hello "
        + "world. " * 40
        + "}\n",
    }
    for name, text in texts.items():
        (root / name).write_text(text, encoding="utf-8")
    body = "".join(texts.values()).encode()
    (root / "archive.gz").write_bytes(gzip.compress(body))
    (root / "archive.bz2").write_bytes(bz2.compress(body))
    with zipfile.ZipFile(root / "archive.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for name in list(texts)[:5]:
            archive.write(root / name, name)
    with tarfile.open(root / "archive.tar", "w") as archive:
        for name in list(texts)[:5]:
            archive.add(root / name, name)
    pixels = (np.arange(64 * 64 * 3, dtype=np.uint32) * 2654435761 % 251).astype(np.uint8)
    picture = Image.fromarray(pixels.reshape(64, 64, 3))
    for suffix in ("png", "jpg", "gif", "bmp", "tiff", "pdf"):
        picture.save(root / f"picture.{suffix}")
    with wave.open(str(root / "tone.wav"), "wb") as sound:
        sound.setnchannels(1)
        sound.setsampwidth(2)
        sound.setframerate(RATE)
        sound.writeframes((np.sin(np.arange(RATE) / 8) * 8000).astype("<i2").tobytes())
    return sorted(root.iterdir())


def _magika(models: Path, into: Path) -> Any:
    """Magika's own package, from its wheel (its Python code and model), on sys.path."""
    with zipfile.ZipFile(models / MAGIKA_WHEEL) as wheel:
        wheel.extractall(into)
    sys.path.insert(0, str(into))
    from magika import Magika

    return Magika()


def _magika_features(magika: Any, path: Path) -> list[int] | None:
    """The model input Magika builds for a file (its own feature extraction, the bytes
    ``_get_raw_predictions`` feeds), or None where it answers without the model."""
    from magika.types.seekable import Seekable

    with path.open("rb") as stream:
        _, features = magika._get_result_or_features_from_seekable(Seekable(stream), path)
    if features is None:
        return None
    config = magika._model_config
    assert config.mid_size == 0  # beginning and end only, as this model version is configured
    return list(features.beg[: config.beg_size]) + list(features.end[-config.end_size :])


def _smart_turn_features(models: Path, seconds: float, frequency: float) -> np.ndarray:
    """Smart Turn's input for a clip, by its own code: 8 s (the clip at the end, silence
    before it) through its Whisper log-mel extraction."""
    spec = importlib.util.spec_from_file_location(
        "smart_turn_features", models / "smart_turn_whisper_features.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    clip = _audio(seconds, frequency) / 32768 * np.linspace(1.0, 0.05, int(RATE * seconds))
    audio = np.pad(clip, (8 * RATE - len(clip), 0)).astype(np.float32)
    return module.compute_whisper_log_mel_features(audio, do_normalize=True).astype(np.float32)


def _audio(seconds: float, frequency: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * frequency * t) * 8000).astype(np.float32)


@pytest.fixture(scope="module")
def built(models: Path, zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("anymodel")
    magika = _magika(models, tmp / "magika_wheel")
    try:
        yield _build(models, zoo, tmp, magika)
    finally:
        sys.path.remove(str(tmp / "magika_wheel"))


def _build(models: Path, zoo: Path, tmp: Path, magika: Any) -> dict:
    files = _sample_files(tmp / "files")
    features = {p: _magika_features(magika, p) for p in files}
    fed = [p for p in files if features[p] is not None]
    np.savez(tmp / "magika.npz", bytes=np.asarray([features[p] for p in fed], dtype=np.int32))
    labels = tmp / "magika_labels.txt"
    labels.write_text("".join(f"{n}\n" for n in magika._model_config.target_labels_space))
    audio = np.stack([_audio(1.0, f) for f in (220.0, 440.0, 880.0, 1760.0)])
    np.savez(tmp / "audio.npz", input=audio)
    photos = sample_photos(zoo, tmp / "photos")
    turns = [
        _smart_turn_features(models, s, f) for s, f in ((1.5, 180.0), (3.0, 240.0), (5.0, 300.0))
    ]
    np.savez(tmp / "turns.npz", input_features=np.stack(turns))
    directions = tmp / "directions.txt"
    directions.write_text("0\n180\n")
    reports = {
        "magika": package(
            str(tmp / "magika_wheel" / "magika" / "models" / "standard_v3_3" / "model.onnx"),
            *FAST,
            *("--name", "magika", "--labels", str(labels), "--variants", "graph"),
            *("--heldout", str(tmp / "magika.npz"), "--out", str(tmp / "magika")),
        ),
        "open_width": package(
            str(models / "ppocr_cls.onnx"),
            *FAST,
            *("--name", "open_width", "--input-shape", "x=-1,3,48,-1", "--variants", "graph"),
            *("--out", str(tmp / "open_width")),
        ),
        "lanczos": package(
            str(models / "ppocr_cls.onnx"),
            *FAST,
            *("--name", "lanczos", "--input-size", "48,192", "--labels", str(directions)),
            *("--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5", "--resize-filter", "lanczos"),
            *("--variants", "graph", "--heldout", str(photos), "--out", str(tmp / "lanczos")),
        ),
        "mel": package(
            str(models / "oww_melspectrogram.onnx"),
            *FAST,
            *("--name", "mel", "--task", "tensor", "--input-shape", "input=-1,-1"),
            *("--variants", "graph", "--heldout", str(tmp / "audio.npz")),
            *("--out", str(tmp / "mel")),
        ),
        "mel_1s": package(
            str(models / "oww_melspectrogram.onnx"),
            *FAST,
            *("--name", "mel_1s", "--task", "tensor", "--input-shape", f"input=-1,{RATE}"),
            *("--variants", "graph", "--heldout", str(tmp / "audio.npz")),
            *("--out", str(tmp / "mel_1s")),
        ),
        "smart_turn": package(
            str(models / SMART_TURN),
            *FAST,
            *("--name", "smart_turn", "--task", "tensor", "--heldout", str(tmp / "turns.npz")),
            *("--variants", "graph", "--out", str(tmp / "smart_turn")),  # int8: no OpenVINO IR
        ),
        "speech_embedding": package(
            str(models / "oww_embedding_model.onnx"),
            *FAST,
            *("--name", "speech_embedding", "--variants", "graph"),
            *("--out", str(tmp / "speech_embedding")),
        ),
    }
    return {"root": tmp, "reports": reports, "magika": magika, "files": fed, "turns": turns}


@pytest.fixture(scope="module")
def agent(built: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    names = ("magika", "open_width", "lanczos", "mel", "mel_1s", "speech_embedding", "smart_turn")
    server = AgentServer(tmp_path_factory.mktemp("agent"), [built["root"] / n for n in names])
    server.start()
    yield server
    server.stop()


def _metadata(client: AgentClient, model: str) -> dict:
    _, body = client.request("GET", f"/v2/models/{model}")
    return json.loads(body)


def test_magika_served_over_v2_answers_its_own_labels(built: dict, agent: AgentServer) -> None:
    magika = built["magika"]
    files: list[Path] = built["files"]
    client = AgentClient(socket_path=agent.socket, timeout=60)
    meta = _metadata(client, "magika")
    assert meta["inputs"] == [{"name": "bytes", "datatype": "INT32", "shape": [-1, 2048]}]
    labels = load_package(built["root"] / "magika").labels
    served, own = [], []
    for path in files:
        feed = np.asarray([_magika_features(magika, path)], dtype=np.int32)
        scores = client.infer("magika", {"bytes": feed}).outputs["target_label"]
        served.append(labels[int(np.argmax(scores[0]))])
        own.append(str(magika.identify_path(path).dl.label))
    assert len(files) >= 20 and len(set(own)) >= 15, (len(files), sorted(set(own)))
    assert served == own


def test_open_width_is_served_at_other_widths(built: dict, agent: AgentServer) -> None:
    root = built["root"] / "open_width"
    toml = (root / "model.toml").read_text(encoding="utf-8")
    assert "[preprocess]" not in toml  # no fixed image size to resize to: a tensor input
    client = AgentClient(socket_path=agent.socket, timeout=60)
    assert _metadata(client, "open_width")["inputs"][0]["shape"] == [-1, 3, 48, -1]
    session = ort.InferenceSession(
        str(MODELS / "ppocr_cls.onnx"), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(1)
    for width in (96, 160, 320):
        tensor = rng.uniform(-1, 1, (1, 3, 48, width)).astype(np.float32)
        served = client.infer("open_width", {"x": tensor}).outputs
        (direct,) = session.run(None, {"x": tensor})
        np.testing.assert_allclose(next(iter(served.values())), direct, rtol=1e-5, atol=1e-6)


def test_resize_filter_is_recorded_and_served(zoo: Path, built: dict, agent: AgentServer) -> None:
    from PIL import Image

    package_dir = built["root"] / "lanczos"
    preprocess = load_package(package_dir).preprocess
    assert preprocess is not None and preprocess.resize_filter == "lanczos"
    assert 'resize_filter = "lanczos"' in (package_dir / "model.toml").read_text("utf-8")
    photo = (zoo / "samples" / "scene.jpg").read_bytes()
    session = ort.InferenceSession(
        str(MODELS / "ppocr_cls.onnx"), providers=["CPUExecutionProvider"]
    )

    def own(resample: Image.Resampling) -> np.ndarray:  # PaddleOCR's normalisation
        image = Image.open(io.BytesIO(photo)).convert("RGB").resize((192, 48), resample)
        pixels = (np.asarray(image, dtype=np.float32) / 255.0 - 0.5) / 0.5
        (scores,) = session.run(None, {"x": pixels.transpose(2, 0, 1)[None].copy()})
        return scores[0]

    lanczos, bilinear = own(Image.Resampling.LANCZOS), own(Image.Resampling.BILINEAR)
    assert np.max(np.abs(lanczos - bilinear)) > 1e-3  # the filter matters to this model
    client = AgentClient(socket_path=agent.socket, timeout=60)
    answer = client.classify("lanczos", photo, top_k=2)
    served = dict(zip(answer["labels"], answer["scores"], strict=True))
    np.testing.assert_allclose([served["0"], served["180"]], lanczos, atol=1e-5)


def test_open_audio_length_and_answered_output_shapes(built: dict, agent: AgentServer) -> None:
    client = AgentClient(socket_path=agent.socket, timeout=60)
    meta = _metadata(client, "mel")
    assert meta["inputs"][0]["shape"] == [-1, -1]
    assert meta["outputs"][0]["shape"] == [-1, 1, -1, 32]  # frames follow the sample count
    # at a fixed length the frames are what the model answered, not the file's open "?"
    fixed = _metadata(client, "mel_1s")
    assert fixed["outputs"][0]["shape"] == [-1, 1, 97, 32]
    session = ort.InferenceSession(
        str(MODELS / "oww_melspectrogram.onnx"), providers=["CPUExecutionProvider"]
    )
    for seconds in (0.5, 1.0, 1.5):
        audio = _audio(seconds, 330.0)[None]
        served = client.infer("mel", {"input": audio}).outputs["output"]
        (direct,) = session.run(None, {"input": audio})
        assert served.shape == direct.shape
        np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-4)


def test_unlabelled_wide_output_is_an_embedding(built: dict, agent: AgentServer) -> None:
    package_dir = built["root"] / "speech_embedding"
    spec = load_package(package_dir)
    assert spec.task == "tensor" and spec.outputs[0].shape == (-1, 1, 1, 96)
    client = AgentClient(socket_path=agent.socket, timeout=60)
    frames = np.random.default_rng(2).uniform(0, 4, (2, 76, 32, 1)).astype(np.float32)
    served = client.infer("speech_embedding", {"input_1": frames}).outputs["conv2d_19"]
    session = ort.InferenceSession(
        str(MODELS / "oww_embedding_model.onnx"), providers=["CPUExecutionProvider"]
    )
    (direct,) = session.run(None, {"input_1": frames})
    np.testing.assert_allclose(served, direct, rtol=1e-4, atol=1e-4)


def test_bad_feeds_and_unservable_detectors_are_refused_cleanly(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "feeds.npz"
    garbage.write_bytes(b"not a zip archive")
    mel = str(models / "oww_melspectrogram.onnx")
    flags = ["--task", "tensor", "--input-shape", "input=-1,-1", "--heldout", str(garbage)]
    code = main(["package", mel, *flags, "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 2 and f"--heldout {garbage}: not a readable .npz of arrays" in err, err
    assert "Traceback" not in err
    face = models / "face_detection_short_range.tflite"
    code = main(["package", str(face), "--task", "detection", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and "/detect could not serve it: pass --task tensor" in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_model_that_exists_only_quantized_is_its_own_reference(
    built: dict, agent: AgentServer
) -> None:
    report = built["reports"]["smart_turn"]
    assert report["reference"]["precision"] == "int8"
    assert (
        report["reference"]["note"] == "no fp32 source: the quantized file itself is the reference"
    )
    variants = {f"{v['runtime']}/{v['precision']}": v for v in report["variants"]}
    assert variants["onnxruntime/int8"]["kept"] and variants["onnxruntime/int8"]["cosine_min"] == 1
    assert list(variants) == ["onnxruntime/int8"]  # the file as it is (OpenVINO's IR: unit test)
    spec = load_package(built["root"] / "smart_turn")
    assert spec.golden is not None and "onnxruntime/int8" in [v.key for v in spec.variants]
    client = AgentClient(socket_path=agent.socket, timeout=60)
    backend = client.status()["models"]["smart_turn"]["versions"]["1.0.0"]
    session = ort.InferenceSession(str(MODELS / SMART_TURN), providers=CPU)
    for features in built["turns"]:
        served = client.infer("smart_turn", {"input_features": features[None]}).outputs["logits"]
        (own,) = session.run(None, {"input_features": features[None]})  # Smart Turn's own run
        exact = backend["runtime"] == "onnxruntime"
        np.testing.assert_allclose(served, own, atol=1e-6 if exact else 0.02)
        assert 0.0 <= float(served[0, 0]) <= 1.0  # a probability, as its pipeline reads it
