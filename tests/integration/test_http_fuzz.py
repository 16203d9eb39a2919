"""The API fuzzed from its own OpenAPI document against a real daemon: no request, valid or
not, gets a server error, and the daemon is alive afterwards (see ``api_fuzz``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from devtools.agent_process import RunningDaemon, running_daemon
from devtools.api_fuzz import FuzzReport, fuzz_operation, operations

EXAMPLES = 15  # per operation and mode: the module stays within about a minute
OPERATIONS = operations()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("fuzz")) as running:
        yield running


@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_no_request_gets_a_server_error(operation, daemon: RunningDaemon) -> None:
    report = FuzzReport()
    fuzz_operation(operation, daemon.url, daemon.headers, EXAMPLES, report)
    assert report.examples > 0
    assert report.server_errors == []
    assert daemon.alive()


def test_the_daemon_is_alive_and_serving_after_the_fuzzing(daemon: RunningDaemon) -> None:
    response = requests.get(f"{daemon.url}/v2/health/ready", headers=daemon.headers, timeout=30)
    assert response.status_code == 200 and daemon.alive()
