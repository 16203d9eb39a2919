"""``FILE.py:FACTORY``: the Python module that defines a network, and the callable that builds it.

PyTorch (``torch_export``) and MindSpore (``mindspore_source``, run in .venv-ms) sources name
their network the same way; both import it here, in the process that has the framework.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeagent.packaging.errors import PackagingError


def import_factory(spec: str, *, by_name: bool = False) -> Callable[[], Any]:
    """The callable ``FACTORY`` of ``FILE.py``; PackagingError names what is wrong.

    ``by_name`` also registers the module under its name and its folder on ``sys.path``, for
    frameworks that import a network's module again to read its source (MindSpore's graph
    compiler does).
    """
    file_name, _, factory = spec.rpartition(":")
    path = Path(file_name)
    if not path.is_file() or not factory:
        raise PackagingError(f"{spec}: expected FILE.py:FACTORY naming an existing file")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    if module_spec is None or module_spec.loader is None:
        raise PackagingError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    if by_name:
        sys.modules[module_spec.name] = module
        sys.path.insert(0, str(path.resolve().parent))
    module_spec.loader.exec_module(module)
    make = getattr(module, factory, None)
    if not callable(make):
        raise PackagingError(f"{path}: has no callable {factory!r}")
    return make
