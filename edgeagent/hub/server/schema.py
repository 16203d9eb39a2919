"""The hub's tables (SQLAlchemy Core), shared by SQLite and PostgreSQL.

Times are Unix seconds (floats): the same type on both databases, and what devices send.
``migrations/`` builds exactly these tables; a test compares the two, so a change here without
a new migration fails.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

devices = sa.Table(
    "devices",
    metadata,
    sa.Column("device_id", sa.String(128), primary_key=True),
    sa.Column("group_name", sa.String(128), nullable=False, server_default=""),
    sa.Column("profile", sa.String(128), nullable=False, server_default=""),
    sa.Column("board", sa.String(256), nullable=False, server_default=""),
    sa.Column("agent_version", sa.String(64), nullable=False, server_default=""),
    # what agent releases it can install: its wheelhouse platform and Python ("": not reported)
    sa.Column("platform", sa.String(64), nullable=False, server_default=""),
    sa.Column("python", sa.String(16), nullable=False, server_default=""),
    sa.Column("availability", sa.String(16), nullable=False, server_default="unknown"),
    sa.Column("models", sa.JSON, nullable=False),  # name → active version
    sa.Column("backends", sa.JSON, nullable=False),  # name → {runtime, device, precision}
    sa.Column("governor_state", sa.String(32), nullable=False, server_default=""),
    sa.Column("temperatures", sa.JSON, nullable=False),  # sensor → °C
    sa.Column("max_temp_c", sa.Float, nullable=True),
    sa.Column("power_w", sa.Float, nullable=True),
    sa.Column("update_state", sa.String(32), nullable=False, server_default="idle"),
    sa.Column("last_result", sa.String(32), nullable=False, server_default=""),
    sa.Column("last_code", sa.String(64), nullable=False, server_default=""),
    sa.Column("last_deployment", sa.String(128), nullable=False, server_default=""),
    sa.Column("reported_at", sa.Float, nullable=True),  # the device's own clock
    sa.Column("last_seen", sa.Float, nullable=False),  # the hub's clock
    sa.Index("ix_devices_group", "group_name"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("device_id", sa.String(128), nullable=False),
    sa.Column("at", sa.Float, nullable=False),  # when the hub received it
    sa.Column("kind", sa.String(16), nullable=False),  # event | state | availability
    sa.Column("deployment_id", sa.String(128), nullable=False, server_default=""),
    sa.Column("step", sa.String(32), nullable=False, server_default=""),
    sa.Column("result", sa.String(32), nullable=False, server_default=""),
    sa.Column("code", sa.String(64), nullable=False, server_default=""),
    sa.Column("detail", sa.JSON, nullable=False),
    # the report's identity (its topic and bytes hashed): a report that two replicas both
    # received, or the broker delivered twice, is stored once (``fleetdb.append_events``)
    sa.Column("report_id", sa.String(64), nullable=True),
    sa.Index("ix_events_device_at", "device_id", "at"),
    sa.Index("ix_events_report", "report_id", unique=True),
    sa.Index("ix_events_at", "at"),
)

releases = sa.Table(
    "releases",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(16), nullable=False, server_default="model"),  # or "agent"
    sa.Column("model", sa.String(128), nullable=False),  # "edgeagent" for agent releases
    sa.Column("version", sa.String(64), nullable=False),
    sa.Column("release_tag", sa.String(128), nullable=False),  # the manifest's deployment_id
    sa.Column("sha256", sa.String(64), nullable=False, unique=True),  # of the envelope
    sa.Column("envelope", sa.LargeBinary, nullable=False),  # exactly as `hub sign` wrote it
    # an agent release's wheelhouse platforms and Python (None and "" for a model's)
    sa.Column("platforms", sa.JSON, nullable=True),
    sa.Column("python", sa.String(16), nullable=False, server_default=""),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_releases_model_version", "model", "version"),
)

deployments = sa.Table(
    "deployments",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("release_id", sa.Integer, sa.ForeignKey("releases.id"), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("group_name", sa.String(128), nullable=False, server_default=""),
    sa.Column("profile_filter", sa.String(128), nullable=False, server_default=""),
    sa.Column("stages_pct", sa.JSON, nullable=False),
    sa.Column("abort_threshold_pct", sa.Float, nullable=False),
    sa.Column("min_executed", sa.Integer, nullable=False),
    sa.Column("stage_timeout_s", sa.Float, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # see deployments.STATES
    sa.Column("stage", sa.Integer, nullable=False, server_default="0"),  # 1-based when running
    sa.Column("stage_count", sa.Integer, nullable=False),
    sa.Column("stage_started_at", sa.Float, nullable=True),
    # a stage's maintenance window, signed into its envelopes: {"2": {"schedule": …}}; None:
    # every stage in the release's own (``hub.server.stage_windows``)
    sa.Column("stage_windows", sa.JSON, nullable=True),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
    sa.Column("rollback_of", sa.String(64), nullable=True),
    # the dates a re-issued release is signed with (a rollback: a fresh serial and lifetime
    # for an old release); None: the uploaded manifest's own
    sa.Column("issued_at", sa.Float, nullable=True),
    sa.Column("expires", sa.Float, nullable=True),
    # an agent release's: the targeted devices it was not for, counted by why (their platform
    # or Python has no wheelhouse in it); None for a model's
    sa.Column("left_out", sa.JSON, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    # when an aborted deployment's cancellation went out (controller._cancel); None: not yet
    sa.Column("cancelled_at", sa.Float, nullable=True),
    sa.Index("ix_deployments_state", "state"),
)

deployment_devices = sa.Table(
    "deployment_devices",
    metadata,
    sa.Column("deployment_id", sa.String(64), sa.ForeignKey("deployments.id"), primary_key=True),
    sa.Column("device_id", sa.String(128), primary_key=True),
    sa.Column("stage", sa.Integer, nullable=False),
    # queued | sent | succeeded | failed | timed_out | not_sent | cancelled
    # (deploydb.DEVICE_STATUSES)
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("sent_at", sa.Float, nullable=True),
    # what it was sent: the envelope (one per stage batch, signed by the server) and serial
    sa.Column("envelope_sha256", sa.String(64), nullable=True),
    sa.Column("serial", sa.BigInteger, nullable=True),
    sa.Column("answered_at", sa.Float, nullable=True),
    sa.Column("result", sa.String(32), nullable=False, server_default=""),
    sa.Column("code", sa.String(64), nullable=False, server_default=""),
    sa.Column("message", sa.Text, nullable=False, server_default=""),
    sa.Index("ix_deployment_devices_device", "device_id"),
)

# The release serial counter, per model: the highest serial the server ever signed, sent or
# received (an upload) for it. Devices refuse a serial that is not above the one they hold, so
# the server signs each envelope with the next number, committed before anything signed with
# it is sent: a crash wastes a number, never reuses one (``releasedb.next_serial``).
model_serials = sa.Table(
    "model_serials",
    metadata,
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("serial", sa.BigInteger, nullable=False),
)

# Samples captured on devices (``samples_db``): one row per (device, sample id), so a device
# that uploads a sample again after a power cut never makes a second row. The image is a file
# under the samples directory (``blob``: its path relative to it); the row holds what the
# model said (``outputs``) and, once someone reviewed it, the label (``annotation``).
samples = sa.Table(
    "samples",
    metadata,
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
    sa.Index("ix_samples_model_version", "model", "version"),
)
# Who runs the rollout controller when several hub servers share this database
# (``leadership``): one row per lease; ``token`` grows by one each time another replica takes
# it, and every write the controller makes checks it (the fencing token).
leases = sa.Table(
    "leases",
    metadata,
    sa.Column("name", sa.String(32), primary_key=True),
    sa.Column("holder", sa.String(128), nullable=False, server_default=""),
    sa.Column("token", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("expires_at", sa.Float, nullable=False, server_default="0"),  # the database's clock
)

# The change counter every replica's long polls follow on PostgreSQL (``changes``): each
# change takes the next number, and a replica that sees the counter move wakes its waiters.
# SQLite serves one process, which counts its changes in memory.
changes_counter = sa.Sequence("changes_counter", metadata=metadata)
