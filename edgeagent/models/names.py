"""What every layer shares about model names and the package format, with no dependencies.

The device (the store, the updater), the fleet contract (release manifests, trust roles) and
the hub (signing, serials) all check names and versions, order versions and name the seal
scheme; they read it here rather than from the package reader so that a hub process signing
a release never imports what reading a model needs (numpy, the task decoders).
"""

from __future__ import annotations

import re
from typing import Literal

# The guards on every model name and version the agent accepts (model.toml, release manifests,
# the store's directory names): whole-string anchors (``$`` would accept a trailing newline),
# ASCII only (``\d`` would accept Arabic-Indic digits) and bounded lengths (a version is at
# most 3 parts of 9 digits, so it always fits in a file name and an int compare is cheap).
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z", re.ASCII)
VERSION_RE = re.compile(r"\A[0-9]{1,9}(\.[0-9]{1,9}){0,2}\Z", re.ASCII)
# What a package's ``task`` may be; it decides its golden record and health check.
TASK_NAMES = ("classification", "detection", "segmentation", "tensor")
# How content keys are wrapped and files sealed (edgeagent.models.seal_crypto implements it).
SEAL_SCHEME = "x25519-hkdf-sha256-aes256gcm"
# The words of a ``[detection]`` table that both its parsed form (models.detection_head) and
# its numpy decoder (models.tasks.decode) speak.
# "postprocessed": the graph ran its own NMS (TF Object Detection API, TFLite detection
# post-process): boxes, classes, scores and a count come out ready, ymin-first ("yxyx").
HeadStyle = Literal["yolo", "ssd", "postprocessed"]
BoxFormat = Literal["cxcywh", "xyxy", "yxyx"]
ScoreActivation = Literal["none", "sigmoid", "softmax"]


def version_tuple(version: str) -> tuple[int, ...]:
    """Order versions numerically: '1.10.0' > '1.9.0', and an int version '3' equals '3.0.0'."""
    parts = [int(p) for p in str(version).split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
