"""A zoo package's model.toml, from its ``ModelSpec``, by the agent's one manifest writer."""

from __future__ import annotations

from pathlib import Path

from edgeagent.models import manifest_writer
from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.manifest_writer import Manifest, VariantFiles
from edgeagent.models.package import ModelPackage, Postprocess, Preprocess, ServingHints, TensorSpec
from modelbuild.convert import INPUT_NAME
from modelbuild.specs import ModelSpec

__all__ = ["VariantFiles", "write_manifest"]


def write_manifest(
    root: Path,
    spec: ModelSpec,
    output_shape: list[int],
    variants: list[VariantFiles],
    golden: str | None = "golden.npz",
) -> ModelPackage:
    """model.toml naming every variant with the SHA-256 of each of its files.

    ``output_shape`` is ``[-1, classes]`` for a classifier, ``[-1, cells, 4 + classes]`` for
    the detector; a classifier gets a ``[postprocess]`` table, a detector its ``[detection]``.
    """
    manifest = Manifest(
        name=spec.name,
        version=spec.version,
        task=spec.task,
        description=spec.description,
        labels="labels.txt",
        golden=golden,
        inputs=(
            TensorSpec(INPUT_NAME, "float32", (-1, spec.channels, spec.size, spec.size), "NCHW"),
        ),
        outputs=(TensorSpec(spec.output_name, "float32", tuple(output_shape)),),
        preprocess=Preprocess(
            size=(spec.size, spec.size),
            resize=spec.resize,
            layout="NCHW",
            color=spec.color,
            scale=1.0 / 255.0,
            mean=spec.mean,
            std=spec.std,
            letterbox=spec.letterbox,
        ),
        postprocess=(
            Postprocess(softmax=True, top_k=min(5, output_shape[-1]))
            if spec.detection is None
            else None
        ),
        detection=None if spec.detection is None else DetectionHead(**spec.detection),
        serving=ServingHints(spec.max_batch_size, spec.max_queue_delay_ms, cache_size=0),
        variants=tuple(variants),
    )
    return manifest_writer.write_manifest(root, manifest)
