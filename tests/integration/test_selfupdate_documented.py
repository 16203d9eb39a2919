"""An agent release installs, commits and rolls back on an A/B root built exactly as
docs/fleet/agent-updates.md says, with nothing of the test environment borrowed.

The wheelhouse of each version is what ``pip wheel . -w wh-<v>`` leaves on a board: the agent's
wheel and a wheel of every dependency (here packed back from the installed distributions,
``tests.support.wheelhouse``: the tests run offline). ``agent-update init`` builds the first
version's venv from it with no ``--extra-site-dir``, the config has no
``agent_extra_site_dirs``, the releases are signed with ``hub sign --agent`` and published with
``hub publish`` into the group's agent slot; the supervisor runs the printed drop-in. Each venv
holds its own pip, and the running version installs the next one with that pip, offline. Three
real venvs (about 20 s each on a busy 2-core box), built once: one test runs the whole story.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.broker import Broker
from devtools.waiting import wait_until
from devtools.wheelhouse import dependency_wheels
from edgeagent.fleet.agent_manifest import this_platform, this_python
from tests.integration.test_hub import hub as hub_cli
from tests.integration.test_selfupdate import BASE, INSTALL_S, Device, _build_wheel, committed

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(900)]

GOOD, BROKEN = "0.2.0", "0.5.0"  # 0.5.0 fails the health check of its confirmation


@pytest.fixture(scope="module")
def wheelhouses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``wh-<version>``: the agent's wheel and every dependency's, as pip wheel leaves them."""
    work = tmp_path_factory.mktemp("wheelhouses")
    houses = {version: _build_wheel(version, work) for version in (BASE, GOOD, BROKEN)}
    agent = next(houses[BASE].glob("edgeagent-*.whl"))
    for wheel in dependency_wheels(agent, work / "deps"):
        for house in houses.values():
            shutil.copy(wheel, house)
    return houses


@pytest.fixture
def device(tmp_path: Path, broker: Broker, wheelhouses: dict[str, Path]) -> Iterator[Device]:
    instance = Device(tmp_path, broker, None, wheelhouses)  # no borrowed site directory
    instance.write_config()
    yield instance
    instance.stop()


def _own(device: Device, version: str) -> dict[str, str]:
    """Where ``version``'s interpreter, run with an empty environment, finds its modules."""
    venv = device.root / "versions" / version / "venv"
    code = (
        "import json, sys, edgeagent, numpy, onnxruntime, pip\n"
        "print(json.dumps({m.__name__: m.__file__ for m in (edgeagent, numpy, onnxruntime, pip)}"
        " | {'path': sys.path}))"
    )
    done = subprocess.run(
        [venv / "bin" / "python", "-c", code],
        env={}, cwd=device.tmp, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    config = (venv / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in config
    base = Path(re.search(r"(?m)^home = (.+)$", config).group(1)).resolve().parent
    for entry in filter(None, found["path"]):  # the venv's own, or the interpreter's stdlib
        resolved = Path(entry).resolve()
        assert resolved.is_relative_to(venv.resolve()) or (
            resolved.is_relative_to(base) and "site-packages" not in resolved.parts
        ), entry
    for name in ("edgeagent", "numpy", "onnxruntime", "pip"):
        assert Path(found[name]).resolve().is_relative_to(venv.resolve()), found
    return found


def _release(device: Device, version: str) -> Path:
    """``hub sign --agent`` of ``wh-<version>``, then ``hub publish`` into the group's slot."""
    url = f"http://127.0.0.1:{device.http.server_address[1]}"
    signed = hub_cli(
        "sign", "--agent", str(device.wheels[version]), "--platform", this_platform(),
        "--python", this_python(), "--key", str(device.hub / "agent.key"), "--base-url", url,
        "--out", str(device.artifacts), "--trust", str(device.hub / "trust.json"), "--json",
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    release = Path(json.loads(signed.stdout)["release"])
    published = hub_cli(
        "publish", str(release), "--group", "lab", "--trust", str(device.hub / "trust.json"),
        "--broker", f"127.0.0.1:{device.broker.port}", "--json",
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["topics"] == ["edgeagent/group/lab/release/_agent"]
    return release


def test_a_release_installs_commits_and_rolls_back_on_the_documented_layout(device: Device):
    printed = device.init()
    assert "ExecStart=\nExecStart=" in printed and "ExecStartPre=\nExecStartPre=" in printed
    _own(device, BASE)
    device.run()

    _release(device, GOOD)
    device.wait_serving(GOOD)
    wait_until(lambda: (device.last_agent_outcome() or {}).get("code") == "committed", 60)
    assert committed(device)["version"] == GOOD
    _own(device, GOOD)  # installed by 0.1.0 with 0.2.0's own pip, offline

    _release(device, BROKEN)
    starts = device.supervisor.starts
    wait_until(lambda: any(s.version == BROKEN for s in starts), timeout=INSTALL_S)
    device.wait_serving(GOOD)  # rolled back
    wait_until(lambda: (device.last_agent_outcome() or {}).get("version") == BROKEN)
    outcome = device.last_agent_outcome()
    assert (outcome["result"], outcome["code"]) == ("failed", "health_check_failed"), outcome
    assert committed(device)["bad"] == [BROKEN]
    assert (device.root / "current").resolve().name == GOOD
