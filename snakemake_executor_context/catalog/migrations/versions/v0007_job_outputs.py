"""Jobs' outputs: each job's output files (the ``job_outputs`` table), by which
``snakemake-context story PATH`` finds the job that wrote one.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the table."""
    op.create_table(
        "job_outputs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_job_outputs_job_id"), "job_outputs", ["job_id"], unique=False)
    op.create_index(op.f("ix_job_outputs_path"), "job_outputs", ["path"], unique=False)
    op.execute("UPDATE catalog_meta SET value = '7' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema version 6."""
    op.execute("UPDATE catalog_meta SET value = '6' WHERE key = 'schema_version'")
    op.drop_index(op.f("ix_job_outputs_path"), table_name="job_outputs")
    op.drop_index(op.f("ix_job_outputs_job_id"), table_name="job_outputs")
    op.drop_table("job_outputs")
