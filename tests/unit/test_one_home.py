"""One name per thing and one home per helper (issue 22 item 7), kept by scanning the tree.

A second copy of a helper drifts from the first (three ``free_port``s, four ad-hoc wait loops
beside ``until``); helpers inside test folders get imported sideways; "zoo" naming the built
packages, the torch builder and the third-party models sent readers to the wrong one.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = ("tests", "devtools", "scripts")  # where test and benchmark helpers live


def functions(top: str) -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted((REPO / top).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((path, node))
    return found


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def polls_with_sleep(node: ast.AST) -> bool:
    """A loop that sleeps: what a wait helper of its own looks like."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    sleeps = any(getattr(c.func, "attr", getattr(c.func, "id", "")) == "sleep" for c in calls)
    return sleeps and any(isinstance(n, ast.While) for n in ast.walk(node))


def test_free_port_is_written_once() -> None:
    homes = [relative(p) for top in SHARED for p, f in functions(top) if f.name == "free_port"]
    assert homes == ["devtools/ports.py"]


def test_waiting_is_done_by_the_one_wait_helper() -> None:
    loops = [
        f"{relative(path)}:{node.lineno} {node.name}"
        for top in SHARED
        for path, node in functions(top)
        if ("wait" in node.name or "until" in node.name)
        and polls_with_sleep(node)
        and relative(path) != "devtools/waiting.py"
    ]
    assert loops == [], "use devtools.waiting.until / wait_until"


def test_test_folders_hold_tests_and_support_holds_helpers() -> None:
    allowed = {"__init__.py", "conftest.py"}
    strays = [
        relative(path)
        for folder in ("tests", "tests/unit", "tests/integration")
        for path in (REPO / folder).glob("*.py")
        if path.name not in allowed and not path.name.startswith("test_")
    ]
    assert strays == [], "test-only helpers go to tests/support/, shared ones to devtools/"


def test_zoo_means_the_built_packages_only() -> None:
    assert not (REPO / "scripts" / "zoo").exists()  # the torch builder is scripts/modelbuild/
    assert (REPO / "scripts" / "modelbuild" / "builder.py").is_file()
    ignored = (REPO / ".gitignore").read_text(encoding="utf-8").split()
    assert "/zoo/" in ignored and not any("zoo" in line for line in ignored if line != "/zoo/")
