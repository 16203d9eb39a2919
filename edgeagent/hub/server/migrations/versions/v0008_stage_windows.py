"""Maintenance windows per deployment stage: each stage's envelopes are signed with its own
window (``stage_windows``: stage number → window object; None: the release's own).

Revision ID: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as table:
        table.add_column(sa.Column("stage_windows", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as table:
        table.drop_column("stage_windows")
