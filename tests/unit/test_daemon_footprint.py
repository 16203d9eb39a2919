"""What a daemon that serves tensors holds: no library it has not been asked to use yet.

Checked in a fresh interpreter, because this test process has long imported everything. Each
of these costs resident memory on a board with little of it (issue 15: Pillow 2 MB, PyYAML
1 MB, gRPC 16 MB); they are imported by the first request that needs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgeagent import heap
from tests.support.helpers import REPO

PROBE = """
import json, sys
import edgeagent.daemon, edgeagent.commands.run
print(json.dumps(sorted(sys.modules)))
"""


def modules_of_a_daemon() -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env
    )
    return {name.split(".")[0] for name in json.loads(result.stdout)}


@pytest.mark.parametrize("library", ["PIL", "yaml", "grpc", "openvino", "ai_edge_litert"])
def test_the_daemon_imports_no_library_before_it_is_used(library: str) -> None:
    assert library not in modules_of_a_daemon()


def test_an_image_imports_pillow_and_still_decodes() -> None:
    import io

    from PIL import Image

    from edgeagent.models.preprocess import decode_image

    png = io.BytesIO()
    Image.new("RGB", (4, 3)).save(png, format="PNG")
    assert decode_image(png.getvalue()).size == (4, 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_heap_calls_exist_on_glibc() -> None:
    if os.confstr("CS_GNU_LIBC_VERSION") is None:  # musl
        pytest.skip("not glibc")
    assert heap.limit_arenas(heap.ARENAS)
    assert heap.release_free_memory()
