"""The ONNX tf2onnx writes, made into what the packager and the agent take.

- **Names**: TensorFlow names tensors ``node:0``; the graph's inputs and outputs lose the
  ``:0`` so model.toml, v2 clients and the golden file use the node names.
- **Pixels**: a TF image model that takes ``uint8`` (the TF Object Detection API's
  ``image_tensor``) gets a float32 input of the same shape, rounded, clipped to 0..255 and cast
  inside the graph, because every package input is float32 (the preprocessing, the golden set
  and the v2 metadata all speak it). The values stay raw pixels: the file records the input in
  ``metadata_props`` (``RAW_PIXELS_KEY``) so the build takes no ``--scale`` 1/255 for it.
- **Outputs**: the TF Object Detection API's four answers come first in the order the
  ``postprocessed`` head reads them (boxes, classes, scores, count); a SavedModel's extra
  signature outputs (raw boxes, anchor indices) are dropped.
- **Size**: an image input whose height and width the graph leaves open is pinned to the size
  given (batch stays open), as ``--input-size`` does for any ONNX.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.options import PackageOptions
from edgeagent.packaging.sources import SourceModel

RAW_PIXELS_KEY = "edgeagent.raw_pixels"  # comma-separated input names fed 0..255 pixel values
# The TF Object Detection API's exported outputs, in the order a post-processed head reads them.
OD_API_OUTPUTS = ("detection_boxes", "detection_classes", "detection_scores", "num_detections")
# tf2onnx leaves the OD API outputs' shapes unknown; they are [batch, K, 4], [batch, K] twice and
# [batch] (K: the graph's max_total_detections, 100 for the usual exports).
_OD_API_DIMS = (
    ("batch", "detections", 4),
    ("batch", "detections"),
    ("batch", "detections"),
    ("batch",),
)
_UINT8, _FLOAT = 2, 1  # onnx.TensorProto element types


def finish(
    raw: Path,
    out: Path,
    size: tuple[int, int] | None,
    progress: Callable,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write the packageable form of ``raw`` to ``out``; returns ``out``. ``metadata``: what
    the graph said about its own preprocessing (its resize filter), kept in ``metadata_props``
    where the packager reads any model's (``labels_meta``)."""
    import onnx

    model = onnx.load(str(raw))
    graph = model.graph
    _strip_output_index(graph)
    names = [o.name for o in graph.output]
    if set(OD_API_OUTPUTS) <= set(names):
        by_name = {o.name: o for o in graph.output}
        ordered = [by_name[n] for n in OD_API_OUTPUTS]
        dropped = [n for n in names if n not in OD_API_OUTPUTS]
        del graph.output[:]
        graph.output.extend(ordered)
        for value, dims in zip(graph.output, _OD_API_DIMS, strict=True):  # the copies extended
            _declare(value, dims)
        if dropped:
            progress(f"TF Object Detection API outputs kept; dropped {', '.join(dropped)}")
    raw_pixels = [_float_pixels(model, value) for value in graph.input if _is_uint8_image(value)]
    if raw_pixels:
        entry = model.metadata_props.add()
        entry.key, entry.value = RAW_PIXELS_KEY, ",".join(raw_pixels)
        progress(f"uint8 input {', '.join(raw_pixels)}: fed as float 0..255, cast in the graph")
    for key, text in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, text
    if size is not None:
        for value in graph.input:
            dims = value.type.tensor_type.shape.dim
            if len(dims) == 4 and dims[3].dim_value in (1, 3, 4):  # TF images are NHWC
                dims[1].dim_value, dims[2].dim_value = size
    onnx.save(model, str(out))
    return out


def raw_pixel_options(
    reference: SourceModel, options: PackageOptions, progress: Callable
) -> PackageOptions:
    """Options for a reference whose input takes raw pixels (a uint8 TF graph): scale 1, no
    mean or std. ``--mean``/``--std`` are refused: the graph casts to uint8, so normalised
    values would be truncated to 0 and 1."""
    if reference.path.suffix != ".onnx":
        return options
    from edgeagent.packaging.labels_meta import onnx_metadata

    raw = onnx_metadata(reference.path).get(RAW_PIXELS_KEY)
    if not raw:
        return options
    if options.mean is not None or options.std is not None:
        raise PackagingError(
            f"{reference.path}: input {raw} takes raw 0..255 pixels (a uint8 graph): "
            "--mean/--std cannot apply; leave them out"
        )
    progress(f"input {raw} takes raw pixels: preprocessing resizes only (scale 1, no mean/std)")
    return replace(options, scale=1.0)


def _declare(value: Any, dims: tuple[int | str, ...]) -> None:
    """Give graph output ``value`` the rank and sizes ``dims`` (a str names an open one)."""
    shape = value.type.tensor_type.shape
    del shape.dim[:]
    for size in dims:
        dim = shape.dim.add()
        if isinstance(size, int):
            dim.dim_value = size
        else:
            dim.dim_param = size


def _strip_output_index(graph: Any) -> None:
    """``name:0`` → ``name`` for the graph's inputs and outputs, everywhere they appear."""
    taken = {o for node in graph.node for o in node.output} | {i.name for i in graph.input}
    renames = {}
    for value in (*graph.input, *graph.output):
        base, _, index = value.name.rpartition(":")
        if base and index == "0" and base not in taken:
            renames[value.name] = base
    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = renames.get(value.name, value.name)
    for node in _all_nodes(graph):
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]


def _all_nodes(graph: Any) -> list[Any]:
    """Every node, those in Loop/If bodies too (they may read the graph's tensors by name)."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attribute in node.attribute:
            if attribute.g.node:
                nodes.extend(_all_nodes(attribute.g))
            for sub in attribute.graphs:
                nodes.extend(_all_nodes(sub))
    return nodes


def _is_uint8_image(value: Any) -> bool:
    kind = value.type.tensor_type
    return kind.elem_type == _UINT8 and len(kind.shape.dim) == 4


def _float_pixels(model: Any, value: Any) -> str:
    """Make input ``value`` float32: Round → Clip(0, 255) → Cast(uint8) feeds what it fed."""
    import numpy as np
    from onnx import helper, numpy_helper

    name = value.name
    inner = f"{name}__uint8"
    for node in _all_nodes(model.graph):
        node.input[:] = [inner if n == name else n for n in node.input]
    low, high = f"{name}__min", f"{name}__max"
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(0.0, np.float32), low),
            numpy_helper.from_array(np.array(255.0, np.float32), high),
        ]
    )
    prologue = [
        helper.make_node("Round", [name], [f"{name}__rounded"]),
        helper.make_node("Clip", [f"{name}__rounded", low, high], [f"{name}__clipped"]),
        helper.make_node("Cast", [f"{name}__clipped"], [inner], to=_UINT8),
    ]
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(prologue + nodes)
    value.type.tensor_type.elem_type = _FLOAT
    return str(name)
