"""Class names: the 1000 ImageNet-1k classes, the ten digits and the detector's four shapes.

``imagenet_classes.tsv`` lists the ImageNet-1k synsets in the standard class-index order with
their WordNet lemmas (extracted once from the synset tables timm ships, Apache-2.0), kept here
so the build needs neither timm nor a download.
"""

from __future__ import annotations

from pathlib import Path

CLASSES = Path(__file__).with_name("imagenet_classes.tsv")


def imagenet_labels() -> list[str]:
    """ImageNet-1k class names in class-index order (the first lemma of each synset)."""
    labels = []
    for line in CLASSES.read_text(encoding="utf-8").splitlines():
        _synset, _, lemmas = line.partition("\t")
        labels.append(lemmas.split(",")[0].strip())
    if len(labels) != 1000:
        raise SystemExit(f"{CLASSES} lists {len(labels)} classes, expected 1000")
    return labels


def digit_labels() -> list[str]:
    return [str(digit) for digit in range(10)]


SHAPES = ("ellipse", "rectangle", "triangle", "cross")  # the synthetic scenes' object kinds


def shape_labels() -> list[str]:
    return list(SHAPES)
