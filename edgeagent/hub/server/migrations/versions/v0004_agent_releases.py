"""Agent releases: each release's kind, with an agent release's platforms and Python;
each device's platform and Python from its state report; an agent deployment's left-out devices.

Every release stored before this revision is a model's (``kind`` defaults to "model").

Revision ID: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases") as releases:
        releases.add_column(
            sa.Column("kind", sa.String(16), nullable=False, server_default="model")
        )
        releases.add_column(sa.Column("platforms", sa.JSON, nullable=True))
        releases.add_column(sa.Column("python", sa.String(16), nullable=False, server_default=""))
    with op.batch_alter_table("devices") as devices:
        devices.add_column(sa.Column("platform", sa.String(64), nullable=False, server_default=""))
        devices.add_column(sa.Column("python", sa.String(16), nullable=False, server_default=""))
    with op.batch_alter_table("deployments") as deployments:
        deployments.add_column(sa.Column("left_out", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as deployments:
        deployments.drop_column("left_out")
    with op.batch_alter_table("devices") as devices:
        devices.drop_column("python")
        devices.drop_column("platform")
    with op.batch_alter_table("releases") as releases:
        releases.drop_column("python")
        releases.drop_column("platforms")
        releases.drop_column("kind")
