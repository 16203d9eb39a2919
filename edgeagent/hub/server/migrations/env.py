"""Alembic's entry point: run the migrations on the connection ``database.upgrade`` hands in.

The server owns the (async) engine, so migrations never open their own connection: they run
inside ``AsyncConnection.run_sync`` on the connection passed in ``config.attributes``.
"""

from __future__ import annotations

from alembic import context

from edgeagent.hub.server.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
