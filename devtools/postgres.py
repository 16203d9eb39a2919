"""A real PostgreSQL for tests and benchmarks, started like the broker: our own cluster, port
and socket.

``initdb`` into a temporary directory and ``pg_ctl start`` on an ephemeral loopback port (trust
authentication, no fsync: a throwaway cluster). PostgreSQL refuses to run as root, so as root
the cluster belongs to the ``postgres`` user the Debian package creates. The test suite's
fixtures (``tests/support/postgres.py``) start one per session; ``scripts/bench_fleet.py`` its
own.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import shutil
import subprocess
from pathlib import Path

from devtools.ports import free_port


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL to start here (not installed, or no ``postgres`` user as root)."""


PG_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def pg_binary(name: str) -> str | None:
    for directory in PG_DIRS:
        if (directory / name).exists():
            return str(directory / name)
    return shutil.which(name)


class Postgres:
    def __init__(self, workdir: Path) -> None:
        self.initdb, self.pg_ctl = pg_binary("initdb"), pg_binary("pg_ctl")
        if self.initdb is None or self.pg_ctl is None:
            raise PostgresUnavailable(
                "PostgreSQL is not installed (apt-get install postgresql): run "
                "scripts/test.sh, which installs it"
            )
        self.workdir = workdir
        self.data = workdir / "data"
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres").pw_name
            except KeyError:
                raise PostgresUnavailable(
                    "running as root needs the 'postgres' user (from the Debian package)"
                ) from None
            info = pwd.getpwnam(self.user)
            os.chown(workdir, info.pw_uid, info.pw_gid)

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        subprocess.run([*prefix, *command], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._run(
            self.initdb,
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} "
            f"-c unix_socket_directories={self.workdir} "
            "-c fsync=off -c full_page_writes=off -c max_connections=50"
        )
        self._run(
            self.pg_ctl,
            "-D",
            str(self.data),
            "-l",
            str(self.workdir / "log"),
            "-w",
            "-o",
            options,
            "start",
        )

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def create_database(self) -> str:
        """A fresh database; returns its SQLAlchemy URL."""
        import asyncpg

        name = f"hub_{secrets.token_hex(4)}"

        async def create() -> None:
            connection = await asyncpg.connect(
                host="127.0.0.1", port=self.port, user="postgres", database="postgres"
            )
            try:
                await connection.execute(f'CREATE DATABASE "{name}"')
            finally:
                await connection.close()

        asyncio.run(create())
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{name}"
