"""Cancellations: when the hub sent an aborted deployment's signed cancellation (and cleared the
group's retained slot if it held the release), so a restart neither forgets nor repeats it.

Deployments aborted before this revision have none; the controller sends theirs on its first
pass (a cancellation of releases already expired is not sent: devices refuse those anyway).

Revision ID: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as table:
        table.add_column(sa.Column("cancelled_at", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as table:
        table.drop_column("cancelled_at")
