"""The catalog: the project's record of where every context lives and what the fleet
did.

Storage only: the events it records are the fleet's vocabulary
(:mod:`..fleet.events`), which the catalog imports and never the reverse. Its write
side and its readers are apart: a reader never imports the writer.

Modules (import them directly; this package imports nothing heavy):

- :mod:`.models`: the SQLAlchemy tables and :data:`~.models.SCHEMA_VERSION`;
- :mod:`.migrations`: the schema's versions (Alembic), an older catalog upgraded in
  place by its writer;
- :mod:`.store`: opening a catalog (path or URL), the schema check, SQLite's WAL
  mode, network filesystems and snapshots (both sides open it);
- :mod:`.writing`: the write side (events become rows, one writer, its lease);
- :mod:`.reading`: the readers, one module per thing read.

Who writes: with the embedded cluster and on a cluster started by ``snakemake-context
up``, the fleet's hub in the scheduler's process (:mod:`..cluster.hub`), to which
executors send their events through Dask; on a Dask cluster this plugin did not start,
the executor process. A PostgreSQL (or any SQLAlchemy) URL may have several writers.
"""

from __future__ import annotations

__all__ = ["catalog_form"]


def catalog_form(flag: str, value: str) -> str | None:
    """The check of a catalog flag's value at start (a ``form`` of
    :class:`..settings.checks.Allowed`): not empty, and :func:`.store.catalog_problem`.
    A URL's password is not repeated in the refusal. SQLAlchemy is imported here, only
    when a catalog is named: every Snakemake start reads the settings."""
    from ..errors import SettingError
    from ..settings.checks import filled
    from .store import catalog_problem

    problem = filled(flag, value) or catalog_problem(value, flag)
    if problem and "://" in value and "@" in value:
        from sqlalchemy.engine import make_url

        shown = make_url(value.strip()).render_as_string(hide_password=True)
        raise SettingError(f"{flag} {shown!r} is not allowed: {problem}.")
    return problem
