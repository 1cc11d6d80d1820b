"""Peer-to-peer transfer: each load's seconds spent fetching from peers, and every
transfer of a context's template from a holder to a receiver.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the column and the table."""
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("peer_seconds", sa.Float(), nullable=True))
    op.create_table(
        "transfers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("context_id", sa.Integer(), nullable=False),
        sa.Column("server_id", sa.Integer(), nullable=False),
        sa.Column("peer", sa.String(length=256), nullable=False),
        sa.Column("peer_server_id", sa.Integer(), nullable=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(length=512), nullable=False),
        sa.ForeignKeyConstraint(["context_id"], ["contexts.id"]),
        sa.ForeignKeyConstraint(["server_id"], ["servers.id"]),
        sa.ForeignKeyConstraint(["peer_server_id"], ["servers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_transfers_context_id"), "transfers", ["context_id"], unique=False)
    op.execute("UPDATE catalog_meta SET value = '4' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema version 3."""
    op.execute("UPDATE catalog_meta SET value = '3' WHERE key = 'schema_version'")
    op.drop_index(op.f("ix_transfers_context_id"), table_name="transfers")
    op.drop_table("transfers")
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("peer_seconds")
