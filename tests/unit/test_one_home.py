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


LAUNCHER = "devtools/agent_process.py"  # the one place the agent is started as a process
SPAWNS = {"Popen", "create_subprocess_exec"}  # a start the caller does not wait out


def literal_words(node: ast.AST) -> list[str]:
    """The string literals of a list, tuple or call's arguments, in order."""
    if isinstance(node, (ast.List, ast.Tuple)):
        items = node.elts
    elif isinstance(node, ast.Call):
        items = node.args
    else:
        return []
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def names_agent_run(node: ast.AST) -> bool:
    """Whether ``node`` writes the agent's command line: ``edgeagent[.cli] … run``."""
    for each in ast.walk(node):
        words = literal_words(each)
        for program in ("edgeagent.cli", "edgeagent"):
            if program in words and "run" in words[words.index(program) :]:
                return True
    return False


def spawns(node: ast.AST) -> bool:
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    return any(getattr(c.func, "attr", getattr(c.func, "id", "")) in SPAWNS for c in calls)


def test_the_agent_is_started_as_a_process_by_the_one_launcher() -> None:
    """A function that starts ``edgeagent run`` and leaves it running is a launcher; a second
    one drifts (its own environment, its own readiness). ``subprocess.run`` of the command,
    which checks how ``run`` exits, is a test of the CLI, not a launcher."""
    launchers = [
        f"{relative(path)}:{node.lineno} {node.name}"
        for top in SHARED
        for path, node in functions(top)
        if relative(path) != LAUNCHER and spawns(node) and names_agent_run(node)
    ]
    assert launchers == [], f"start the agent with {LAUNCHER} (spawn_agent or its helpers)"
    homes = {relative(p) for top in SHARED for p, f in functions(top) if names_agent_run(f)}
    assert LAUNCHER in homes  # the criterion still recognises the launcher it guards


def imported_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def test_nothing_under_scripts_imports_the_test_suite() -> None:
    """Benchmarks and tools share helpers through ``devtools/``: a script that imports
    ``tests`` runs only from a checkout with the suite, and ties the suite's helpers to it."""
    imports = [
        f"{relative(path)}: {module}"
        for path in sorted((REPO / "scripts").rglob("*.py"))
        for module in imported_modules(path)
        if module == "tests" or module.startswith("tests.")
    ]
    assert imports == [], "move the helper to devtools/"


SIGNED_DOCUMENT_READERS = (
    "edgeagent/fleet/manifest.py",
    "edgeagent/fleet/agent_manifest.py",
    "edgeagent/fleet/cancel.py",
)
# what a hand-written check of an untrusted field looks like: a type test, a pattern match,
# a URL split; each has its one home in fleet/wire.py's Reader
HAND_CHECKS = {"isinstance", "type", "urlsplit", "match", "fullmatch"}


def hand_checks(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in HAND_CHECKS:
                found.append(f"{relative(path)}:{node.lineno} {name}(")
    return found


def test_signed_documents_are_read_only_through_the_wire_reader() -> None:
    """Release manifests (model and agent) and cancellations are security-critical and share
    their opening: a type or pattern check written beside a field drifts from the same check
    of the other documents, so every one goes through ``fleet.wire.Reader``."""
    checks = [c for name in SIGNED_DOCUMENT_READERS for c in hand_checks(REPO / name)]
    assert checks == [], "read the field with fleet.wire.Reader (add the rule there)"
    assert hand_checks(REPO / "edgeagent/fleet/wire.py")  # the criterion sees the checks it moves
