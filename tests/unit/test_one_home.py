"""One name per thing and one home per helper (issue 22 item 7), kept by scanning the tree.

A second copy of a helper drifts from the first (three ``free_port``s, four ad-hoc wait loops
beside ``until``); helpers inside test folders get imported sideways; "zoo" naming the built
packages, the torch builder and the third-party models sent readers to the wrong one.
"""

from __future__ import annotations

import ast
import re
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


# Outcome codes: where a code is spelled, it says why something ended (a refusal's or failure's
# first argument, a ``code=``, a comparison with a ``code``, a set of codes in a constant).
# The same word as another vocabulary (a deployment's status "cancelled", a download setting
# "timeout") is not a code there and is left alone.
CODE_HOMES = ("edgeagent/updates", "edgeagent/hub", "edgeagent/fleet", "edgeagent/selfupdate")
SAYS_WHY = re.compile(r"(Refused|Failed|Error|refuse|_fail|roll_back)$")


def called_name(node: ast.AST) -> str:
    return getattr(node, "attr", getattr(node, "id", ""))


def code_literals(tree: ast.AST, codes: frozenset[str]) -> list[ast.Constant]:
    """The string literals equal to an outcome code in the places a code goes."""
    found: list[ast.Constant] = []

    def take(node: ast.AST | None) -> None:
        if isinstance(node, ast.Constant) and node.value in codes:
            found.append(node)
        elif isinstance(node, ast.IfExp):
            take(node.body)
            take(node.orelse)
        elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            for item in node.elts:
                take(item)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = called_name(node.func)
            if SAYS_WHY.search(name):
                for arg in node.args:
                    take(arg)
            if name == "outcome" and len(node.args) >= 3:  # (release, result, code, …)
                take(node.args[2])
            for keyword in node.keywords:
                if keyword.arg == "code":
                    take(keyword.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args
            defaults = zip(
                args[len(args) - len(node.args.defaults) :], node.args.defaults, strict=True
            )
            for arg, default in [
                *defaults,
                *zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True),
            ]:
                if "code" in arg.arg:
                    take(default)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any("code" in called_name(side).lower() for side in sides):
                for side in sides:
                    take(side)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [called_name(t) for t in targets]
            constant_set = isinstance(node.value, (ast.Set, ast.Tuple, ast.List))
            if any("code" in n.lower() or (constant_set and n.isupper()) for n in names):
                take(node.value)
    return found


def test_outcome_codes_are_spelled_only_in_fleet_outcomes() -> None:
    """The hub reads codes back (``same_version`` means done): a code spelled twice can drift
    into two codes, and nothing would notice until a deployment stalled."""
    from edgeagent.fleet.outcomes import CODES

    spelled = [
        f"{relative(path)}:{node.lineno} {node.value!r}"
        for top in CODE_HOMES
        for path in sorted((REPO / top).rglob("*.py"))
        if relative(path) != "edgeagent/fleet/outcomes.py"
        for node in code_literals(ast.parse(path.read_text(encoding="utf-8")), CODES)
    ]
    assert spelled == [], "use the constant of edgeagent.fleet.outcomes"


def test_the_code_scan_recognises_codes_where_they_go() -> None:
    """The guard above can fail: each place a code goes is recognised, other words are not."""
    codes = frozenset({"malformed", "same_version"})
    sample = """
raise Refused("malformed", "x")
self.reporter.outcome(release, "refused", "same_version", message)
failure = InstallFailed(code="malformed")
if exc.code != "same_version": pass
ALREADY_DONE = {"same_version"}
def parse(text, code="malformed"): pass
status = "malformed"  # not a code's place
log.info("malformed")
"""
    found = sorted(node.lineno for node in code_literals(ast.parse(sample), codes))
    assert found == [2, 3, 4, 5, 6, 7]


def test_the_messages_page_lists_exactly_the_outcome_codes() -> None:
    from edgeagent.fleet.outcomes import CODES, MEANINGS

    page = (REPO / "docs" / "fleet" / "messages.md").read_text(encoding="utf-8")
    table = page.split("## Outcome codes", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| `")]
    listed = [code for row in rows for code in re.findall(r"`([a-z_]+)`", row[2])]
    assert sorted(listed) == sorted(CODES), "docs/fleet/messages.md's outcome-code table"
    assert len(listed) == len(set(listed))
    assert all(MEANINGS[code].strip() for code in CODES)


def test_a_release_is_named_by_the_one_release_ref() -> None:
    """An outcome names its release by model, version and deployment; a dict of those three
    built by hand in one more place is one more place to forget a field."""
    identity = {"model", "version", "deployment_id"}
    built = [
        f"{relative(path)}:{node.lineno}"
        for top in ("edgeagent/updates", "edgeagent/fleet")
        for path in sorted((REPO / top).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Dict)
        and {k.value for k in node.keys if isinstance(k, ast.Constant)} == identity
    ]
    assert built == [], "use edgeagent.fleet.release_ref.ReleaseRef"


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
