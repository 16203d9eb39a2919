"""Alembic migrations for the hub database, shipped in the package; the server upgrades on
start (``database.upgrade``). Add a file to ``versions/`` for every change to ``schema.py``."""
