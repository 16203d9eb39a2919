"""The hub server fuzzed from the document it serves (issue 23, finding 10 and its Build bullet):
schemathesis draws requests that follow ``/openapi.json`` and requests that break it, for every
operation, and every answer must be no 5xx, a status and body the document allows, and a 4xx
for every request that breaks it (the server is never looser than its document).

Each operation is fuzzed twice: with drawn path ids (mostly unknown: the 404s) and with the ids
of a real device, release and deployment (the bodies reach the database). The server runs in
this process with a real broker and two simulated devices; the fuzzer's blocking requests run in
a thread. ``--max-wait`` is small so that drawn long polls end quickly.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from devtools.api_fuzz import FuzzReport, fuzz_operation, operations
from devtools.broker import Broker
from devtools.hub_fleet import Api, fleet, hub_server, write_tokens
from devtools.waiting import until
from tests.support.postgres import postgres_fixture  # noqa: F401

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

ADMIN = "a" * 24
CHECKS = (
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
    negative_data_rejection,
)


async def _fuzz(broker: Broker, database_url: str, tmp_path: Path, examples: int) -> FuzzReport:
    settings = broker.settings()
    tokens = write_tokens(tmp_path / "tokens", admin=ADMIN)
    async with (
        fleet(settings, 2),
        hub_server(database_url, settings, token_file=tokens, max_wait_s=0.2) as url,
    ):
        api = Api(url, ADMIN)

        async def synced() -> bool:
            return (await api.call("GET", "/api/v1/health"))["synced"]

        await until(synced, 30, what="the hub read the retained reports")
        created = await api.deploy("2.0.0", stages_pct=[50, 100])
        real = {
            "device_id": "dev-000",
            "release_id": created["release"]["id"],
            "deployment_id": created["id"],
        }
        document = await api.call("GET", "/openapi.json")
        # Tokens are tested on their own (test_hub_server_api): here every request is admin's,
        # so a drawn request "without its token" would be no invalid request at all.
        document.pop("security")
        for item in document["paths"].values():
            for method in item.values():
                method.pop("security", None)
        report = FuzzReport()
        for operation in operations(document):
            drawn = [{}] + ([real] if operation.path_parameters else [])
            for path_values in drawn:
                await asyncio.to_thread(
                    fuzz_operation,
                    operation,
                    url,
                    api.headers,
                    examples,
                    report,
                    path_values=path_values,
                    checks=CHECKS,
                )
        assert (await api.call("GET", "/api/v1/health"))["synced"]  # alive and answering
    return report


def _assert_clean(report: FuzzReport) -> None:
    assert report.examples > 0
    assert report.server_errors == []
    assert report.mismatches == []
    assert any(400 <= status < 500 for status in report.statuses), report.statuses
    assert any(200 <= status < 300 for status in report.statuses), report.statuses


async def test_fuzzed_on_sqlite(broker: Broker, tmp_path: Path) -> None:
    report = await _fuzz(broker, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}", tmp_path, 25)
    _assert_clean(report)


async def test_fuzzed_on_postgresql(broker: Broker, tmp_path: Path, postgres) -> None:
    database_url = await asyncio.to_thread(postgres.create_database)  # it runs its own loop
    report = await _fuzz(broker, database_url, tmp_path, 5)
    _assert_clean(report)
