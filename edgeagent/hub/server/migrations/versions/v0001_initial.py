"""The first hub schema: devices, event history, releases, deployments and their devices.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("group_name", sa.String(128), nullable=False, server_default=""),
        sa.Column("profile", sa.String(128), nullable=False, server_default=""),
        sa.Column("board", sa.String(256), nullable=False, server_default=""),
        sa.Column("agent_version", sa.String(64), nullable=False, server_default=""),
        sa.Column("availability", sa.String(16), nullable=False, server_default="unknown"),
        sa.Column("models", sa.JSON, nullable=False),
        sa.Column("backends", sa.JSON, nullable=False),
        sa.Column("governor_state", sa.String(32), nullable=False, server_default=""),
        sa.Column("temperatures", sa.JSON, nullable=False),
        sa.Column("max_temp_c", sa.Float, nullable=True),
        sa.Column("power_w", sa.Float, nullable=True),
        sa.Column("update_state", sa.String(32), nullable=False, server_default="idle"),
        sa.Column("last_result", sa.String(32), nullable=False, server_default=""),
        sa.Column("last_code", sa.String(64), nullable=False, server_default=""),
        sa.Column("last_deployment", sa.String(128), nullable=False, server_default=""),
        sa.Column("reported_at", sa.Float, nullable=True),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_index("ix_devices_group", "devices", ["group_name"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("deployment_id", sa.String(128), nullable=False, server_default=""),
        sa.Column("step", sa.String(32), nullable=False, server_default=""),
        sa.Column("result", sa.String(32), nullable=False, server_default=""),
        sa.Column("code", sa.String(64), nullable=False, server_default=""),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_index("ix_events_device_at", "events", ["device_id", "at"])
    op.create_index("ix_events_at", "events", ["at"])
    op.create_table(
        "releases",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("release_tag", sa.String(128), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("envelope", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_releases_model_version", "releases", ["model", "version"])
    op.create_table(
        "deployments",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("release_id", sa.Integer, sa.ForeignKey("releases.id"), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("group_name", sa.String(128), nullable=False, server_default=""),
        sa.Column("profile_filter", sa.String(128), nullable=False, server_default=""),
        sa.Column("stages_pct", sa.JSON, nullable=False),
        sa.Column("abort_threshold_pct", sa.Float, nullable=False),
        sa.Column("min_executed", sa.Integer, nullable=False),
        sa.Column("stage_timeout_s", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("stage", sa.Integer, nullable=False, server_default="0"),
        sa.Column("stage_count", sa.Integer, nullable=False),
        sa.Column("stage_started_at", sa.Float, nullable=True),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("rollback_of", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_deployments_state", "deployments", ["state"])
    op.create_table(
        "deployment_devices",
        sa.Column(
            "deployment_id", sa.String(64), sa.ForeignKey("deployments.id"), primary_key=True
        ),
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("stage", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("sent_at", sa.Float, nullable=True),
        sa.Column("answered_at", sa.Float, nullable=True),
        sa.Column("result", sa.String(32), nullable=False, server_default=""),
        sa.Column("code", sa.String(64), nullable=False, server_default=""),
        sa.Column("message", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_deployment_devices_device", "deployment_devices", ["device_id"])


def downgrade() -> None:
    for table in ("deployment_devices", "deployments", "releases", "events", "devices"):
        op.drop_table(table)
