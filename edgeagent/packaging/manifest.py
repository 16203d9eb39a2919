"""What the packager declares in model.toml; ``edgeagent.models.manifest_writer`` writes it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.manifest_writer import Manifest, VariantFiles
from edgeagent.models.package import Postprocess, Preprocess, ServingHints
from edgeagent.models.sequence_table import SequenceSpec
from edgeagent.packaging.options import LogicalModel
from edgeagent.packaging.variants import Made

# A classifier exported from a training framework answers logits; five classes by default.
CLASSIFIER_POSTPROCESS = Postprocess(softmax=True, top_k=5)


def describe(
    *,
    name: str,
    version: str,
    description: str,
    logical: LogicalModel,
    preprocess: Preprocess | None,
    labels: str | None,
    golden: str | None,
    variants: Sequence[Made],
    root: Path,
    detection: DetectionHead | None = None,
    sequence: SequenceSpec | None = None,
) -> Manifest:
    """The package of ``variants`` (files relative to ``root``).

    A layout is declared on 4-D inputs only (it means where the image channels sit), and on a
    variant only where its file differs from the package's logical layout.
    """
    logical_layout = logical.layout or "NCHW"
    return Manifest(
        name=name,
        version=version,
        task=logical.task,
        description=description,
        labels=labels,
        golden=golden,
        device_files=(),  # labels and golden (the writer adds them); validation.json stays home
        inputs=tuple(
            replace(t, layout=logical.layout if len(t.shape) == 4 else None) for t in logical.inputs
        ),
        outputs=tuple(replace(t, layout=None) for t in logical.outputs),
        preprocess=preprocess,
        postprocess=Postprocess(softmax=logical.softmax, top_k=5)
        if logical.task == "classification"
        else None,
        detection=detection,
        sequence=sequence,
        # Never more rows a run than the model takes: a fixed batch is served one at a time.
        serving=None if logical.batches else ServingHints(max_batch_size=1),
        variants=tuple(
            VariantFiles(
                made.runtime,
                made.precision,
                tuple(str(f.relative_to(root)) for f in made.files),
                made.layout if made.layout not in (None, logical_layout) else None,
            )
            for made in variants
        ),
    )
