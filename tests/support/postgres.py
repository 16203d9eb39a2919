"""The test suite's PostgreSQL: one throwaway cluster per session (``devtools.postgres``), a
fresh database in it per test, and the ``database_url`` fixture that runs a test once on a
SQLite file and once on PostgreSQL. A machine without PostgreSQL skips, saying how to get it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.postgres import Postgres, PostgresUnavailable

__all__ = ["Postgres", "database_url_fixture", "postgres_fixture"]


@pytest.fixture(scope="session", name="postgres")
def postgres_fixture() -> Iterator[Postgres]:
    workdir = Path(tempfile.mkdtemp(prefix="edgeagent-pg-"))
    try:
        server = Postgres(workdir)
    except PostgresUnavailable as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.skip(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"], name="database_url")
def database_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test that takes this runs once on a SQLite file and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}"
    return request.getfixturevalue("postgres").create_database()
