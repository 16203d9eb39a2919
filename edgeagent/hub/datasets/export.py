"""Export samples as COCO, YOLO or ImageFolder datasets (what ``supervision`` and most trainers
read unchanged).

- ``coco`` (detection): ``images/`` and ``annotations.json`` (categories numbered from 1, boxes
  as ``[x, y, w, h]``);
- ``yolo`` (detection): ``images/``, ``labels/`` (one ``class cx cy w h`` line per box,
  normalised) and ``data.yaml`` (``names``, ``nc``);
- ``imagefolder`` (classification): one folder per class holding its images.

A sample's label is the reviewer's (accepted or corrected) or, with ``include_new``, the
model's own answer; rejected samples are never exported. Each image keeps a name made of its
device and sample id, so two exports of the same samples are the same files. The images come
from the hub's blob store (a directory or a bucket), copied one by one into the new dataset.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from edgeagent.hub.blobs import BlobStore

Rows = list[dict[str, Any]]
FORMATS = {"coco": "detection", "yolo": "detection", "imagefolder": "classification"}


class ExportError(ValueError):
    pass


def _name(row: dict[str, Any]) -> str:
    return f"{row['device_id']}-{row['sample_id']}.jpg"


def usable(rows: Iterable[dict[str, Any]], include_new: bool) -> list[dict[str, Any]]:
    wanted = {"accepted", "corrected"} | ({"new"} if include_new else set())
    return [row for row in rows if row["status"] in wanted]


def label(row: dict[str, Any]) -> dict[str, Any]:
    """The reviewer's annotation, else the model's answer in the same shape."""
    if row.get("annotation"):
        return dict(row["annotation"])
    outputs = row["outputs"]
    if row["task"] == "classification":
        return {"label": (outputs.get("labels") or [""])[0]}
    return {"detections": [{"label": d["label"], "box": d["box"]} for d in outputs["detections"]]}


def export(
    rows: list[dict[str, Any]],
    blobs: BlobStore,
    out: Path,
    fmt: str,
    *,
    classes: list[str] | None = None,
) -> dict[str, Any]:
    """Write the dataset of ``rows`` to ``out`` (which must not exist); a summary back."""
    if fmt not in FORMATS:
        raise ExportError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    tasks = {row["task"] for row in rows}
    if tasks - {FORMATS[fmt]}:
        raise ExportError(
            f"{fmt} holds {FORMATS[fmt]} samples; these are {', '.join(sorted(tasks))}"
        )
    if out.exists():
        raise ExportError(f"{out} exists: export into a new directory")
    labels = [label(row) for row in rows]
    names = classes or sorted(
        {lab["label"] for lab in labels if "label" in lab}
        | {d["label"] for lab in labels for d in lab.get("detections", [])}
    )
    index = {name: i for i, name in enumerate(names)}
    writer = {"coco": _coco, "yolo": _yolo, "imagefolder": _imagefolder}[fmt]
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    writer(rows, labels, blobs, staging, names, index)
    staging.rename(out)
    return {"format": fmt, "samples": len(rows), "classes": names, "path": str(out)}


def _known(index: dict[str, int], name: str) -> int:
    if name not in index:
        raise ExportError(f"label {name!r} is not one of the classes {list(index)}")
    return index[name]


def _coco(
    rows: Rows, labels: Rows, blobs: BlobStore, out: Path, names: list[str], index: dict[str, int]
) -> None:
    (out / "images").mkdir()
    images: Rows = []
    annotations: Rows = []
    for image_id, (row, lab) in enumerate(zip(rows, labels, strict=True), 1):
        blobs.copy_to(row["blob"], out / "images" / _name(row))
        size = {"width": row["width"], "height": row["height"]}
        images.append({"id": image_id, "file_name": _name(row), **size})
        for det in lab["detections"]:
            x1, y1, x2, y2 = det["box"]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": _known(index, det["label"]) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                }
            )
    categories = [{"id": i + 1, "name": name, "supercategory": ""} for i, name in enumerate(names)]
    document = {"images": images, "annotations": annotations, "categories": categories}
    (out / "annotations.json").write_text(json.dumps(document), encoding="utf-8")


def _yolo(
    rows: Rows, labels: Rows, blobs: BlobStore, out: Path, names: list[str], index: dict[str, int]
) -> None:
    (out / "images").mkdir()
    (out / "labels").mkdir()
    for row, lab in zip(rows, labels, strict=True):
        blobs.copy_to(row["blob"], out / "images" / _name(row))
        width, height = row["width"], row["height"]
        lines = []
        for det in lab["detections"]:
            x1, y1, x2, y2 = det["box"]
            cx, cy = (x1 + x2) / 2 / width, (y1 + y2) / 2 / height
            w, h = (x2 - x1) / width, (y2 - y1) / height
            lines.append(f"{_known(index, det['label'])} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
        stem = _name(row).removesuffix(".jpg")
        (out / "labels" / f"{stem}.txt").write_text("\n".join(lines) + "\n" if lines else "")
    data = {"names": list(names), "nc": len(names)}
    (out / "data.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")


def _imagefolder(
    rows: Rows, labels: Rows, blobs: BlobStore, out: Path, names: list[str], index: dict[str, int]
) -> None:
    for name in names:  # a class is a folder: a label that is not a plain name is refused
        if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
            raise ExportError(f"label {name!r} cannot name a folder")
        (out / name).mkdir()
    for row, lab in zip(rows, labels, strict=True):
        _known(index, lab["label"])
        blobs.copy_to(row["blob"], out / lab["label"] / _name(row))
