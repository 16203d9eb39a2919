"""The third-party models scripts/fetch_models.py fetches, and ``edgeagent package`` run in
process the way the tests of those models run it."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

from edgeagent.cli import main
from tests.support.helpers import REPO

MODELS = Path(os.environ.get("EDGEAGENT_THIRD_PARTY", REPO / "third-party-models"))
SAMPLE_PHOTOS = ("china.jpg", "flower.png", "scene.jpg")


def package(*argv: str) -> dict:
    """``edgeagent package ARGV --threads 1 --json``, which must succeed; its JSON report."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["package", *argv, "--threads", "1", "--json"]) == 0
    return json.loads(stdout.getvalue())


def sample_photos(zoo: Path, into: Path) -> Path:
    """A directory of the zoo's sample photos (held-out or calibration images)."""
    into.mkdir()
    for photo in SAMPLE_PHOTOS:
        (into / photo).write_bytes((zoo / "samples" / photo).read_bytes())
    return into
