"""The captured-sample upload: the one contract between a device's uploader and the hub.

A device sends each sample once per attempt as ``PUT /device/v1/samples/{id}``: the body is
the JPEG, the ``X-Edgeagent-Sample`` header the record (base64url of its JSON), the bearer
token the device's own upload token. The id names the sample on that device, so a repeated
PUT (the device lost power before it saw the answer) is answered "already stored" and never
stored twice. ``GET /device/v1/samples/policy`` tells a device whether its group may upload.
Both sides parse the record with ``parse_record``, so they refuse the same faults alike.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

from edgeagent.fleet.wire import MessageError, dump, parse

UPLOAD_PATH = "/device/v1/samples/{sample_id}"
POLICY_PATH = "/device/v1/samples/policy"
DEVICE_PREFIX = "/device/v1/"  # authenticated by device upload tokens, not hub tokens
RECORD_HEADER = "X-Edgeagent-Sample"
MAX_RECORD_CHARS = 6000  # one header line (aiohttp's own cap on a header field is 8190)
MAX_DETECTIONS = 100
SAMPLE_ID_RE = re.compile(r"^\d{13}-[0-9a-f]{16}$")
NAME_RE = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,64}$")  # names folders: never . or ..
JPEG_MAGIC = b"\xff\xd8\xff"


@dataclass(frozen=True)
class Detection:
    label: str
    score: float
    box: list[float]


@dataclass(frozen=True)
class Outputs:
    labels: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    detections: list[Detection] = field(default_factory=list)


@dataclass(frozen=True)
class SampleRecord:
    """What a sample says about itself (the capture's ``sample_record``)."""

    id: str
    device_id: str
    model: str
    version: str
    variant: str
    task: str
    captured_at: float
    width: int
    height: int
    outputs: Outputs
    redacted_regions: int = 0


def parse_record(data: Any) -> SampleRecord:
    """The checked record; MessageError naming the first fault."""
    record = parse(SampleRecord, data, "sample record")
    checks = [
        (bool(SAMPLE_ID_RE.match(record.id)), "id", "must be <13 digits>-<16 hex digits>"),
        (bool(NAME_RE.match(record.model)), "model", "not a model name"),
        (bool(NAME_RE.match(record.version)), "version", "not a version"),
        (bool(NAME_RE.match(record.device_id)), "device_id", "not a device id"),
        (record.task in ("classification", "detection"), "task", "classification or detection"),
        (0 < record.width <= 8192 and 0 < record.height <= 8192, "width", "must be 1..8192"),
        (len(record.outputs.detections) <= MAX_DETECTIONS, "outputs", "too many detections"),
        (len(record.outputs.labels) <= 1000, "outputs", "too many labels"),
        (
            all(len(d.box) == 4 for d in record.outputs.detections),
            "outputs.detections",
            "a box is [x1, y1, x2, y2]",
        ),
    ]
    for ok, path, problem in checks:
        if not ok:
            raise MessageError("sample record", path, problem)
    return record


def encode_record(record: dict[str, Any]) -> str:
    text = json.dumps(record, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(text).decode("ascii")


def decode_record(header: str) -> SampleRecord:
    """The record of an upload's header; MessageError when it is not one."""
    if len(header) > MAX_RECORD_CHARS:
        raise MessageError("sample record", "", f"longer than {MAX_RECORD_CHARS} characters")
    try:
        data = json.loads(base64.urlsafe_b64decode(header.encode("ascii")))
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise MessageError("sample record", "", f"not base64url of JSON: {exc}") from None
    return parse_record(data)


def record_json(record: SampleRecord) -> dict[str, Any]:
    return dump(record)
