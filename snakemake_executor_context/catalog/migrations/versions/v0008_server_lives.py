"""Servers' lives: each server's partition, pool and group, and what ended it, from
which the survival estimates (:mod:`....fleet.survival`) are made.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_COLUMNS = ("partition", "pool", "group_label", "ended_by")


def upgrade() -> None:
    """Add the columns (servers recorded before have none: their lives are not used)."""
    with op.batch_alter_table("servers") as batch:
        batch.add_column(sa.Column("partition", sa.String(256), nullable=True))
        batch.add_column(sa.Column("pool", sa.String(256), nullable=True))
        batch.add_column(sa.Column("group_label", sa.String(256), nullable=True))
        batch.add_column(sa.Column("ended_by", sa.String(16), nullable=True))
    op.execute("UPDATE catalog_meta SET value = '8' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema version 7."""
    op.execute("UPDATE catalog_meta SET value = '7' WHERE key = 'schema_version'")
    with op.batch_alter_table("servers") as batch:
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
