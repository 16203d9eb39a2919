"""MobileNetV3-Small 1.0 for 32×32 greyscale digits: the student ``bench_distil`` teaches.

``make()`` is the ``file.py:factory`` that ``edgeagent package ... --distil-from TEACHER``
imports (in .venv-build, beside scripts/modelbuild): the zoo's MobileNetV3-Small at full width
with a one-channel stem of stride 1, as the MobileNetV2 teacher (scripts/prune/
digits_mobilenetv2.py) has, so the two differ in their design and nothing else.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modelbuild.mobilenetv3 import MobileNetV3Small


def make() -> MobileNetV3Small:
    return MobileNetV3Small(num_classes=10, in_channels=1, stem_stride=1)
