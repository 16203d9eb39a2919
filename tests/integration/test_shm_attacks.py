"""Shared memory under attack (issue 23 findings 3 and 4), against ``edgeagent run`` processes.

- A client that truncates its own object after registering it used to kill the daemon with
  SIGBUS (a mapped page past the end of the file); now the access is refused with a 400 and the
  daemon serves on, even while the object is shrunk and grown under a stream of requests.
- A region belongs to whoever registered it: another local user (a second uid through
  ``setpriv``, when the tests run as root) can neither list, use nor unregister it, and the
  agent opens an object for a caller only when that caller could open it itself.
- Over TCP the agent cannot know the caller's uid: shared memory is socket-only by default.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from devtools.agent_process import RunningDaemon, running_daemon
from edgeagent.api.client import AgentClient, AgentError

ROWS = 2
INPUT_BYTES = ROWS * 3 * 8 * 8 * 4
OUTPUT_BYTES = ROWS * 4 * 4
NOBODY = 65534
PREFIX = "/v2/systemsharedmemory"

# What another local user runs: the standard library only, talking HTTP over the Unix socket.
_CLIENT = r"""
import http.client, json, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(sys.argv[1])
connection = Unix("localhost")
body = sys.argv[4].encode() if len(sys.argv) > 4 else None
connection.request(sys.argv[2], sys.argv[3], body=body)
answer = connection.getresponse()
print(json.dumps({"status": answer.status, "body": answer.read().decode()}))
"""


@pytest.fixture
def objects() -> Iterator[dict[str, Path]]:
    """An input and an output object under /dev/shm (the test is the app that owns them)."""
    tag = uuid.uuid4().hex[:8]
    made = {"in": Path(f"/dev/shm/ea-in-{tag}"), "out": Path(f"/dev/shm/ea-out-{tag}")}
    for name, path in made.items():
        path.write_bytes(bytes(INPUT_BYTES if name == "in" else OUTPUT_BYTES))
        path.chmod(0o600)
    yield made
    for path in made.values():
        path.unlink(missing_ok=True)


def _register(client: AgentClient, name: str, path: Path, size: int) -> None:
    body = {"key": "/" + path.name, "offset": 0, "byte_size": size}
    client.request("POST", f"{PREFIX}/region/{name}/register", json.dumps(body).encode())


def _infer_body() -> bytes:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [ROWS, 3, 8, 8],
                    "parameters": {
                        "shared_memory_region": "in",
                        "shared_memory_byte_size": INPUT_BYTES,
                    },
                }
            ],
            "outputs": [
                {
                    "name": "logits",
                    "parameters": {
                        "shared_memory_region": "out",
                        "shared_memory_byte_size": OUTPUT_BYTES,
                    },
                }
            ],
        }
    ).encode()


def _infer(client: AgentClient) -> None:
    client.request("POST", "/v2/models/tiny/infer", _infer_body())


def _frame(path: Path, seed: int) -> None:
    batch = np.random.default_rng(seed).random((ROWS, 3, 8, 8), dtype=np.float32)
    path.write_bytes(batch.tobytes())


# ---------------------------------------------------------------------------------------------
# Finding 3: a truncated object never faults the daemon


@pytest.mark.parametrize("which", ["in", "out"])
def test_a_truncated_region_is_refused_and_the_daemon_serves_on(
    tmp_path: Path, objects: dict[str, Path], which: str
) -> None:
    with running_daemon(tmp_path) as daemon:
        client = AgentClient(socket_path=daemon.socket)
        _register(client, "in", objects["in"], INPUT_BYTES)
        _register(client, "out", objects["out"], OUTPUT_BYTES)
        _frame(objects["in"], 1)
        _infer(client)  # the control: the regions serve
        answered = objects["out"].read_bytes()
        assert answered != bytes(OUTPUT_BYTES)
        os.truncate(objects[which], 0)
        with pytest.raises(AgentError, match="shrank to 0 bytes") as refused:
            _infer(client)
        assert refused.value.status == 400
        assert daemon.alive(), f"the daemon died: exit {daemon.process.returncode}"
        os.truncate(objects[which], INPUT_BYTES if which == "in" else OUTPUT_BYTES)
        _frame(objects["in"], 1)
        _infer(client)  # still serving, from the same registrations
        assert objects["out"].read_bytes() == answered


def test_shrinking_and_growing_under_a_stream_of_requests_never_faults(
    tmp_path: Path, objects: dict[str, Path]
) -> None:
    """Truncation racing each access (a size check alone would lose this race)."""
    with running_daemon(tmp_path) as daemon:
        client = AgentClient(socket_path=daemon.socket)
        _register(client, "in", objects["in"], INPUT_BYTES)
        _register(client, "out", objects["out"], OUTPUT_BYTES)
        stop = threading.Event()

        def flap() -> None:
            while not stop.is_set():
                for path, size in ((objects["in"], INPUT_BYTES), (objects["out"], OUTPUT_BYTES)):
                    os.truncate(path, 0)
                    os.truncate(path, size)

        flapper = threading.Thread(target=flap)
        flapper.start()
        statuses = []
        try:
            for _ in range(150):
                try:
                    _infer(client)
                    statuses.append(200)
                except AgentError as exc:
                    statuses.append(exc.status)
        finally:
            stop.set()
            flapper.join()
        assert daemon.alive(), f"the daemon died: exit {daemon.process.returncode}"
        assert set(statuses) <= {200, 400}, statuses
        _infer(client)


# ---------------------------------------------------------------------------------------------
# Finding 4: regions are bound to their caller; objects opened only for who could open them


def test_shared_memory_is_refused_over_tcp_by_default(
    tmp_path: Path, objects: dict[str, Path]
) -> None:
    with running_daemon(tmp_path) as daemon:
        objects["in"].chmod(0o666)  # even an object every user may open
        body = {"key": "/" + objects["in"].name, "byte_size": 16}
        answer = requests.post(
            f"{daemon.url}{PREFIX}/region/in/register", json=body, headers=daemon.headers
        )
        assert answer.status_code == 403
        assert "[shared_memory] tcp = false" in answer.json()["error"]
        listed = requests.get(f"{daemon.url}{PREFIX}/status", headers=daemon.headers)
        assert listed.status_code == 403
        AgentClient(socket_path=daemon.socket).request("GET", "/v2/health/ready")


def test_over_tcp_when_enabled_only_objects_anyone_may_open(
    tmp_path: Path, objects: dict[str, Path]
) -> None:
    with running_daemon(tmp_path, "[shared_memory]\ntcp = true\n") as daemon:
        url = f"{daemon.url}{PREFIX}/region"
        body = {"key": "/" + objects["in"].name, "byte_size": 16}
        private = requests.post(f"{url}/in/register", json=body, headers=daemon.headers)
        assert private.status_code == 403
        assert "cannot be opened read-write by any local user" in private.json()["error"]
        objects["in"].chmod(0o666)
        opened = requests.post(f"{url}/in/register", json=body, headers=daemon.headers)
        assert opened.status_code == 200, opened.text
        # another token is another caller: it sees none of these regions
        admin = {"Authorization": "Bearer daemon-test-admin-token"}
        assert requests.get(f"{daemon.url}{PREFIX}/status", headers=admin).json() == []
        assert requests.post(f"{url}/in/unregister", headers=admin).status_code == 404
        mine = requests.get(f"{daemon.url}{PREFIX}/status", headers=daemon.headers).json()
        assert [region["name"] for region in mine] == ["in"]


def _system_python() -> str | None:
    """A Python another user can run (the venv's may live under root's 0700 home)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


needs_second_user = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or _system_python() is None,
    reason="a second local user needs root, setpriv and a system Python",
)


@pytest.fixture
def open_daemon() -> Iterator[RunningDaemon]:
    """A daemon whose socket every local user may reach (a world-traversable directory)."""
    root = Path(tempfile.mkdtemp(prefix="ea-shm-"))
    try:
        root.chmod(0o755)
        (root / "run").mkdir(mode=0o755)
        with running_daemon(root, "socket_mode = 0o666\n") as daemon:
            yield daemon
    finally:
        shutil.rmtree(root)


def _as_nobody(daemon: RunningDaemon, method: str, path: str, body: object = None):
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    command += [str(_system_python()), "-I", "-c", _CLIENT, str(daemon.socket), method, path]
    if body is not None:
        command.append(json.dumps(body))
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    answer = json.loads(done.stdout)
    return answer["status"], answer["body"]


@needs_second_user
def test_another_user_cannot_register_an_object_it_could_not_open(
    open_daemon: RunningDaemon, objects: dict[str, Path]
) -> None:
    objects["in"].chmod(0o660)  # the owner's group (root's) may open it; nobody may not
    body = {"key": "/" + objects["in"].name, "byte_size": 16}
    status, text = _as_nobody(open_daemon, "POST", f"{PREFIX}/region/x/register", body)
    assert status == 403 and f"uid {NOBODY}" in text, text
    own = Path(f"/dev/shm/ea-nobody-{uuid.uuid4().hex[:8]}")
    own.write_bytes(bytes(16))
    try:
        os.chown(own, NOBODY, NOBODY)
        own.chmod(0o600)  # the control: its own object
        mine = {"key": "/" + own.name, "byte_size": 16}
        status, text = _as_nobody(open_daemon, "POST", f"{PREFIX}/region/x/register", mine)
        assert status == 200, text
        status, text = _as_nobody(open_daemon, "GET", f"{PREFIX}/status")
        assert [region["name"] for region in json.loads(text)] == ["x"]
    finally:
        own.unlink()
    assert open_daemon.alive()


@needs_second_user
def test_another_user_cannot_list_use_or_unregister_a_region(
    open_daemon: RunningDaemon, objects: dict[str, Path]
) -> None:
    client = AgentClient(socket_path=open_daemon.socket)
    for path in objects.values():
        path.chmod(0o666)  # even objects the other user may open: the regions are not its own
    _register(client, "in", objects["in"], INPUT_BYTES)
    _register(client, "out", objects["out"], OUTPUT_BYTES)
    _frame(objects["in"], 2)
    _infer(client)
    answered = objects["out"].read_bytes()
    status, text = _as_nobody(open_daemon, "GET", f"{PREFIX}/status")
    assert (status, json.loads(text)) == (200, [])
    status, text = _as_nobody(open_daemon, "POST", f"{PREFIX}/region/out/unregister")
    assert status == 404, text
    status, _ = _as_nobody(open_daemon, "POST", f"{PREFIX}/unregister")  # "all": its own only
    assert status == 200
    status, text = _as_nobody(
        open_daemon, "POST", "/v2/models/tiny/infer", json.loads(_infer_body())
    )
    assert status == 404 and "no shared memory region 'in'" in text, text
    assert objects["out"].read_bytes() == answered
    listed = json.loads(client.request("GET", f"{PREFIX}/status")[1])
    assert [region["name"] for region in listed] == ["in", "out"]
    _infer(client)  # the owner's regions still serve
    assert open_daemon.alive()
