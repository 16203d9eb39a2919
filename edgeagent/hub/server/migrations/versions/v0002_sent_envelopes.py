"""What each device was sent: the envelope's SHA-256 and the release serial, per device.

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployment_devices") as table:
        table.add_column(sa.Column("envelope_sha256", sa.String(64), nullable=True))
        table.add_column(sa.Column("serial", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployment_devices") as table:
        table.drop_column("serial")
        table.drop_column("envelope_sha256")
