"""Samples captured on devices: metadata here, the images as files beside the database.

Revision ID: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("sample_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("variant", sa.String(128), nullable=False, server_default=""),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("captured_at", sa.Float, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("height", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("blob", sa.String(512), nullable=False),
        sa.Column("outputs", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="new"),
        sa.Column("annotation", sa.JSON, nullable=True),
        sa.Column("reviewed_at", sa.Float, nullable=True),
        sa.UniqueConstraint("device_id", "sample_id", name="uq_samples_device_sample"),
    )
    op.create_index("ix_samples_model_version", "samples", ["model", "version"])


def downgrade() -> None:
    op.drop_index("ix_samples_model_version", "samples")
    op.drop_table("samples")
