"""Deployment state has one writer: every insert, update or delete of ``deployments`` and
``deployment_devices`` rows is a named transition in ``hub/server/deploydb.py``; the controller,
the canceller, the API and the ingest decide and call one. Kept by scanning the source, so a
write added anywhere else (the controller updating rows itself again) fails here."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TABLES = {"deployments", "deployment_devices", "dd"}  # dd: the modules' alias of the second
WRITES = {"insert", "update", "delete"}
OWNER = "edgeagent/hub/server/deploydb.py"


def table_writes(path: Path) -> list[str]:
    """Every ``<table>.insert/update/delete(...)`` call on a deployment table in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in TABLES
        ):
            found.append(f"{path.relative_to(REPO).as_posix()}:{node.lineno}")
    return found


def test_only_deploydb_writes_deployment_rows() -> None:
    writers = [
        where
        for path in sorted((REPO / "edgeagent").rglob("*.py"))
        if "migrations" not in path.parts
        for where in table_writes(path)
        if not where.startswith(f"{OWNER}:")
    ]
    assert writers == [], "write deployment rows through a named transition in deploydb"


def test_the_scan_sees_the_owners_writes() -> None:
    # the scan must recognise the writes it forbids elsewhere, or the test above proves nothing
    assert len(table_writes(REPO / OWNER)) >= 8
