"""The story of a job: each attempt's log and the stimulus that placed it, the
report's stimulus and message, and the decisions between (``job_story``).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: Indexes added to version 1 after its first catalogs were made (those lack them).
LATE_INDEXES = (
    ("ix_runs_started", "runs", "started"),
    ("ix_attempts_loss_id", "attempts", "loss_id"),
)


def upgrade() -> None:
    """Add the columns and the table; the indexes an early catalog lacks."""
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("log", sa.Text(), nullable=True))
        batch.add_column(sa.Column("stimulus", sa.String(length=128), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("stimulus", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("message", sa.Text(), nullable=True))
    op.create_table(
        "job_story",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt_key", sa.String(length=256), nullable=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("what", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("stimulus", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_job_story_job_id"), "job_story", ["job_id"], unique=False)
    existing = {
        index["name"]
        for table in ("runs", "attempts")
        for index in sa.inspect(op.get_bind()).get_indexes(table)
    }
    for name, table, column in LATE_INDEXES:
        if name not in existing:
            op.create_index(name, table, [column], unique=False)
    op.execute("UPDATE catalog_meta SET value = '2' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema version 1."""
    op.execute("UPDATE catalog_meta SET value = '1' WHERE key = 'schema_version'")
    op.drop_index(op.f("ix_job_story_job_id"), table_name="job_story")
    op.drop_table("job_story")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("message")
        batch.drop_column("stimulus")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("stimulus")
        batch.drop_column("log")
