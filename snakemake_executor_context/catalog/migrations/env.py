"""Alembic's environment: run the migrations on the connection :mod:`.runner` hands
over (``config.attributes["connection"]``), inside the transaction it holds."""

from __future__ import annotations

from alembic import context

config = context.config
context.configure(connection=config.attributes["connection"])
with context.begin_transaction():
    context.run_migrations()
