"""The release serial counter per model, and the dates of a re-issued (rolled-back) release.

The counter starts above every serial the database already knows for the model: those of its
stored releases (read from their envelopes) and those it recorded as sent to devices.

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from edgeagent.fleet.manifest import parse_manifest
from edgeagent.fleet.signing import TrustError, decode_envelope

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _known_serials(connection: sa.Connection) -> dict[str, int]:
    """model → the highest serial among its stored releases and the serials sent for it."""
    highest: dict[str, int] = {}
    for model, envelope in connection.execute(sa.text("SELECT model, envelope FROM releases")):
        try:
            manifest = parse_manifest(decode_envelope(envelope, max_bytes=len(envelope)).payload)
        except TrustError:  # stored only once these checks passed: never seen, but no reason
            continue  # to refuse the upgrade over it
        highest[model] = max(highest.get(model, 0), manifest.serial)
    sent = connection.execute(
        sa.text(
            "SELECT d.model, MAX(dd.serial) FROM deployment_devices dd "
            "JOIN deployments d ON d.id = dd.deployment_id "
            "WHERE dd.serial IS NOT NULL GROUP BY d.model"
        )
    )
    for model, serial in sent:
        highest[model] = max(highest.get(model, 0), int(serial))
    return highest


def upgrade() -> None:
    table = op.create_table(
        "model_serials",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("serial", sa.BigInteger, nullable=False),
    )
    with op.batch_alter_table("deployments") as deployments:
        deployments.add_column(sa.Column("issued_at", sa.Float, nullable=True))
        deployments.add_column(sa.Column("expires", sa.Float, nullable=True))
    known = _known_serials(op.get_bind())
    if known:
        op.bulk_insert(table, [{"model": m, "serial": s} for m, s in sorted(known.items())])


def downgrade() -> None:
    with op.batch_alter_table("deployments") as deployments:
        deployments.drop_column("expires")
        deployments.drop_column("issued_at")
    op.drop_table("model_serials")
