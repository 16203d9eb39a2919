"""Replicas: the controller's lease row (leadership and its fencing token), each report's
identity (a report that two replicas received is stored once) and, on PostgreSQL, the change
counter the replicas' long polls follow.

Revision ID: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    leases = op.create_table(
        "leases",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(128), nullable=False, server_default=""),
        sa.Column("token", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("expires_at", sa.Float, nullable=False, server_default="0"),
    )
    op.bulk_insert(leases, [{"name": "controller", "holder": "", "token": 0, "expires_at": 0.0}])
    with op.batch_alter_table("events") as events:
        events.add_column(sa.Column("report_id", sa.String(64), nullable=True))
        events.create_index("ix_events_report", ["report_id"], unique=True)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence("changes_counter")))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.DropSequence(sa.Sequence("changes_counter")))
    with op.batch_alter_table("events") as events:
        events.drop_index("ix_events_report")
        events.drop_column("report_id")
    op.drop_table("leases")
