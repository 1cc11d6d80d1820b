"""Damaged cache entries: each model-cache entry a server found damaged (its files
differ from the manifest recorded when they were written) and moved aside.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the table."""
    op.create_table(
        "damaged_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("server_id", sa.Integer(), nullable=False),
        sa.Column("context_id", sa.Integer(), nullable=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("entry", sa.Text(), nullable=False),
        sa.Column("aside", sa.Text(), nullable=False),
        sa.Column("problem", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["context_id"], ["contexts.id"]),
        sa.ForeignKeyConstraint(["server_id"], ["servers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        op.f("ix_damaged_entries_server_id"), "damaged_entries", ["server_id"], unique=False
    )
    op.execute("UPDATE catalog_meta SET value = '6' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema version 5."""
    op.execute("UPDATE catalog_meta SET value = '5' WHERE key = 'schema_version'")
    op.drop_index(op.f("ix_damaged_entries_server_id"), table_name="damaged_entries")
    op.drop_table("damaged_entries")
