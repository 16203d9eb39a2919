"""Optional dependencies a command needs: the pip command that installs them, before any work.

A command whose optional extra is missing says which ``pip install 'edgeagent[EXTRA]'`` fixes
it and exits 2, instead of failing minutes later with a ModuleNotFoundError traceback.
"""

from __future__ import annotations

import importlib


def missing_extra(extra: str, *modules: str) -> str | None:
    """What to tell the user when one of ``modules`` (edgeagent's ``extra``) cannot be imported.

    Imported rather than looked up (importlib.util.find_spec): a module that is present but
    broken (a missing shared library, a wrong build) fails the same way at use.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"needs {module} ({exc}): pip install 'edgeagent[{extra}]'"
    return None
