"""Schema version 1: the tables as release 0.1 created them (before migrations).

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
    """Create the tables of schema version 1."""
    op.create_table(
        "catalog_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "contexts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("loader", sa.Text(), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("identity"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("workdir", sa.Text(), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("jobs_total", sa.Integer(), nullable=True),
        sa.Column("started", sa.Float(), nullable=False),
        sa.Column("finished", sa.Float(), nullable=True),
        sa.Column("heartbeat", sa.Float(), nullable=True),
        sa.Column("ok", sa.Boolean(), nullable=True),
        sa.Column("jobs_ok", sa.Integer(), nullable=False),
        sa.Column("jobs_failed", sa.Integer(), nullable=False),
        sa.Column("items", sa.BigInteger(), nullable=False),
        sa.Column("loads", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id"),
    )
    op.create_index(op.f("ix_runs_started"), "runs", ["started"], unique=False)
    op.create_table(
        "servers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(length=256), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=True),
        sa.Column("gpu_name", sa.String(length=256), nullable=True),
        sa.Column("gpu_model", sa.String(length=256), nullable=False),
        sa.Column("gpu_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("compute_capability", sa.String(length=16), nullable=True),
        sa.Column("is_mig", sa.Boolean(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_budget", sa.BigInteger(), nullable=True),
        sa.Column("joined", sa.Float(), nullable=False),
        sa.Column("left", sa.Float(), nullable=True),
        sa.Column("left_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_servers_address"), "servers", ["address"], unique=False)
    op.create_index(
        "ux_servers_live_address",
        "servers",
        ["address"],
        unique=True,
        sqlite_where=sa.text('"left" IS NULL'),
        postgresql_where=sa.text('"left" IS NULL'),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=True),
        sa.Column("server_id", sa.Integer(), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"]),
        sa.ForeignKeyConstraint(["server_id"], ["servers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_events_at"), "events", ["at"], unique=False)
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("jobid", sa.String(length=64), nullable=False),
        sa.Column("rule", sa.String(length=256), nullable=False),
        sa.Column("wildcards", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("context_id", sa.Integer(), nullable=True),
        sa.Column("submitted", sa.Float(), nullable=True),
        sa.Column("finished", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("items", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["context_id"], ["contexts.id"]),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_pk", "jobid"),
    )
    op.create_table(
        "placements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("context_id", sa.Integer(), nullable=False),
        sa.Column("server_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("loading_at", sa.Float(), nullable=False),
        sa.Column("ready_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("load_seconds", sa.Float(), nullable=True),
        sa.Column("from_cache", sa.Boolean(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["context_id"], ["contexts.id"]),
        sa.ForeignKeyConstraint(["server_id"], ["servers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_placements_server_context", "placements", ["server_id", "context_id"], unique=False
    )
    op.create_index(op.f("ix_placements_state"), "placements", ["state"], unique=False)
    op.create_table(
        "server_losses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("server_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("jobs_lost", sa.Integer(), nullable=False),
        sa.Column("seconds_lost", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["server_id"], ["servers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_server_losses_at"), "server_losses", ["at"], unique=False)
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("server_id", sa.Integer(), nullable=True),
        sa.Column("placed_by", sa.String(length=64), nullable=True),
        sa.Column("dispatched", sa.Float(), nullable=True),
        sa.Column("started", sa.Float(), nullable=True),
        sa.Column("finished", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("items", sa.BigInteger(), nullable=False),
        sa.Column("load_seconds", sa.Float(), nullable=False),
        sa.Column("cold", sa.Boolean(), nullable=False),
        sa.Column("loss_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.ForeignKeyConstraint(["loss_id"], ["server_losses.id"]),
        sa.ForeignKeyConstraint(["server_id"], ["servers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_attempts_finished"), "attempts", ["finished"], unique=False)
    op.create_index(op.f("ix_attempts_job_id"), "attempts", ["job_id"], unique=False)
    op.create_index(op.f("ix_attempts_key"), "attempts", ["key"], unique=False)
    op.create_index(op.f("ix_attempts_loss_id"), "attempts", ["loss_id"], unique=False)
    op.create_index(op.f("ix_attempts_server_id"), "attempts", ["server_id"], unique=False)
    op.execute("INSERT INTO catalog_meta (key, value) VALUES ('schema_version', '1')")


def downgrade() -> None:
    """Drop every table."""
    for table in (
        "attempts",
        "server_losses",
        "placements",
        "jobs",
        "events",
        "servers",
        "runs",
        "contexts",
        "catalog_meta",
    ):
        op.drop_table(table)
