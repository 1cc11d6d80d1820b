"""Gangs: a placement of a context that spans several processes records its ranks,
and its members (each rank's device, node, pid and shard bytes, the backend).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the two columns."""
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("ranks", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("gang", sa.Text(), nullable=True))
    op.execute("UPDATE catalog_meta SET value = '5' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema version 4."""
    op.execute("UPDATE catalog_meta SET value = '4' WHERE key = 'schema_version'")
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("gang")
        batch.drop_column("ranks")
