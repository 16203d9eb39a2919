"""The package's imports flow down the layers of ARCHITECTURE.md, with no cycles.

Every ``import`` in ``edgeagent/`` (module level and lazy ones inside functions alike) is read
with ``ast``; an import from a lower layer into a higher one, between two packages of the same
layer, or a cycle between modules fails the test with the offending lines named.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "edgeagent"

# Top to bottom; a module may import from its own package or from any lower layer.
LAYERS: list[set[str]] = [
    {"cli"},
    {"commands"},
    {"daemon"},
    {"config"},
    {"api", "hub", "governor", "packaging", "streams"},
    {"updates", "capture"},
    {"selfupdate"},
    {"fleet"},
    {"engine"},
    {"hardware"},
    {"models"},
    {"runtimes"},
    {"tls"},
    {
        "sections",
        "paths",
        "fsutil",
        "aio",
        "sdnotify",
        "heap",
        "netaddr",
        "httpguard",
        "logs",
        "_toml",
        "__init__",
    },
]
RANK = {unit: depth for depth, layer in enumerate(LAYERS) for unit in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: ``edgeagent.engine.batcher`` → ``engine``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for every edgeagent module ``path`` imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("edgeagent")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("edgeagent"):
                continue
            for alias in node.names:  # `from edgeagent.api import v2` names a module
                candidate = f"{node.module}.{alias.name}"
                found.append((node.lineno, candidate if candidate in known else node.module))
    return found


def graph() -> dict[str, list[tuple[int, str]]]:
    table = modules()
    return {name: imports_of(path, set(table)) for name, path in table.items()}


def layering_violations(edges: dict[str, list[tuple[int, str]]]) -> list[str]:
    problems = []
    for source, targets in edges.items():
        here = unit_of(source)
        for line, target in targets:
            there = unit_of(target)
            if there == here:
                continue
            if here not in RANK or there not in RANK:
                problems.append(f"{source}:{line} → {target}: {here or there} has no layer")
            elif RANK[there] <= RANK[here]:
                way = "across its layer" if RANK[there] == RANK[here] else "upwards"
                problems.append(f"{source}:{line} imports {target} ({way}: {here} → {there})")
    return problems


def cycles(edges: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for _line, target in edges.get(node, []):
            if target not in edges:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in edges:
        if node not in index:
            visit(node)
    return groups


def test_every_package_and_module_has_a_layer():
    units = {unit_of(name) for name in modules()}
    assert units - set(RANK) == set(), "add the new package to LAYERS (and ARCHITECTURE.md)"


def test_no_import_runs_upwards_or_across_a_layer():
    assert layering_violations(graph()) == []


def test_no_import_cycles_between_modules():
    assert cycles(graph()) == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"edgeagent.models.a": [(3, "edgeagent.engine.b")], "edgeagent.engine.b": []}, 1),
        ({"edgeagent.api.a": [(1, "edgeagent.hub.b")], "edgeagent.hub.b": []}, 1),
        ({"edgeagent.engine.a": [(1, "edgeagent.models.b")], "edgeagent.models.b": []}, 0),
    ],
)
def test_the_checker_sees_an_upward_or_sideways_import(edges, expected):
    assert len(layering_violations(edges)) == expected


def test_the_checker_sees_a_cycle():
    edges = {
        "edgeagent.engine.a": [(1, "edgeagent.engine.b")],
        "edgeagent.engine.b": [(1, "edgeagent.engine.c")],
        "edgeagent.engine.c": [(1, "edgeagent.engine.a")],
    }
    assert cycles(edges) == [["edgeagent.engine.a", "edgeagent.engine.b", "edgeagent.engine.c"]]


# The hub signs, serves and watches releases; it must run without the serving stack (issue 22):
# no path of imports, however indirect, leads from it into these packages.
HUB_NEVER_REACHES = {"engine", "hardware", "runtimes", "api"}
# ...except the runtime facts table: the names and file suffixes of each runtime are part of the
# package format (issue 22 §5: suffixes come from it only), and the hub reads packages to sign
# them. It imports nothing; importing it runs runtimes/__init__.py, which loads the plugin
# contract (numpy) only when asked for, as the import test below checks.
HUB_MAY_READ = {"edgeagent.runtimes.facts"}


def reach(
    edges: dict[str, list[tuple[int, str]]],
    start: str,
    banned: set[str],
    allowed: set[str] = HUB_MAY_READ,
) -> list[str]:
    """The import chain from ``start`` to the first module of a ``banned`` unit, or [].

    A module in ``allowed`` is not a hit, but what it imports is still followed.
    """
    parents: dict[str, str] = {start: ""}
    queue = [start]
    while queue:
        module = queue.pop(0)
        if unit_of(module) in banned and module not in allowed:
            chain = [module]
            while parents[chain[-1]]:
                chain.append(parents[chain[-1]])
            return chain[::-1]
        for _line, target in edges.get(module, []):
            if target in edges and target not in parents:
                parents[target] = module
                queue.append(target)
    return []


def test_the_hub_never_imports_the_serving_stack():
    edges = graph()
    chains = [reach(edges, m, HUB_NEVER_REACHES) for m in edges if unit_of(m) == "hub"]
    assert [" → ".join(c) for c in chains if c] == []


def test_the_hub_rule_sees_an_indirect_import():
    edges = {
        "edgeagent.hub.a": [(1, "edgeagent.fleet.b")],
        "edgeagent.fleet.b": [(2, "edgeagent.engine.c")],
        "edgeagent.engine.c": [],
    }
    chain = ["edgeagent.hub.a", "edgeagent.fleet.b", "edgeagent.engine.c"]
    assert reach(edges, "edgeagent.hub.a", HUB_NEVER_REACHES) == chain


@pytest.mark.parametrize(
    ("target", "hit"),
    [("edgeagent.runtimes.facts", False), ("edgeagent.runtimes.base", True)],
)
def test_the_hub_rule_lets_the_hub_read_the_runtime_facts_only(target: str, hit: bool):
    edges = {
        "edgeagent.hub.a": [(1, "edgeagent.models.b")],
        "edgeagent.models.b": [(2, target)],
        target: [],
    }
    assert bool(reach(edges, "edgeagent.hub.a", HUB_NEVER_REACHES)) is hit


def test_the_hub_rule_follows_imports_past_an_allowed_module():
    edges = {
        "edgeagent.hub.a": [(1, "edgeagent.runtimes.facts")],
        "edgeagent.runtimes.facts": [(2, "edgeagent.runtimes.base")],
        "edgeagent.runtimes.base": [],
    }
    chain = ["edgeagent.hub.a", "edgeagent.runtimes.facts", "edgeagent.runtimes.base"]
    assert reach(edges, "edgeagent.hub.a", HUB_NEVER_REACHES) == chain


def modules_loaded_by(statement: str) -> set[str]:
    """Every module in ``sys.modules`` after ``statement`` runs in a fresh interpreter."""
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(done.stdout.split())


def test_signing_a_release_loads_neither_numpy_nor_prometheus():
    loaded = modules_loaded_by("import edgeagent.hub.sign")
    assert {"numpy", "prometheus_client"} & loaded == set()
    # What the graph rule cannot see: importing runtimes.facts runs runtimes/__init__.py.
    serving = {m for m in loaded if m.startswith("edgeagent.") and unit_of(m) in HUB_NEVER_REACHES}
    assert serving <= HUB_MAY_READ | {"edgeagent.runtimes"}
