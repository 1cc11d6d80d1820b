"""The ledger's facts: each server's GPUs, drain and batch allocation, each load's
conversions, the forward batches each attempt led, and the pools' pilots.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the columns and the two tables."""
    with op.batch_alter_table("servers") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("draining_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("allocated_at", sa.Float(), nullable=True))
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("conversions", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("reload_seconds", sa.Float(), nullable=True))
    op.create_table(
        "forward_batches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        op.f("ix_forward_batches_attempt_id"), "forward_batches", ["attempt_id"], unique=False
    )
    op.create_table(
        "pilots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=256), nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("submitted", sa.Float(), nullable=False),
        sa.Column("registered", sa.Float(), nullable=True),
        sa.Column("first_task", sa.Float(), nullable=True),
        sa.Column("ended", sa.Float(), nullable=True),
        sa.Column("batch_state", sa.String(length=64), nullable=True),
        sa.Column("busy_seconds", sa.Float(), nullable=False),
        sa.Column("released", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "submitted"),
    )
    op.create_index(op.f("ix_pilots_name"), "pilots", ["name"], unique=False)
    op.execute("UPDATE catalog_meta SET value = '3' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema version 2."""
    op.execute("UPDATE catalog_meta SET value = '2' WHERE key = 'schema_version'")
    op.drop_index(op.f("ix_pilots_name"), table_name="pilots")
    op.drop_table("pilots")
    op.drop_index(op.f("ix_forward_batches_attempt_id"), table_name="forward_batches")
    op.drop_table("forward_batches")
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("reload_seconds")
        batch.drop_column("conversions")
    with op.batch_alter_table("servers") as batch:
        batch.drop_column("allocated_at")
        batch.drop_column("draining_at")
        batch.drop_column("gpus")
