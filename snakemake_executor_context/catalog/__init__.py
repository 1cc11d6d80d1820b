"""The catalog: the project's record of where every context lives and what the fleet
did.

Modules (import them directly; this package imports nothing heavy):

- :mod:`.events`: the events servers, the scheduler plugin and executors send
  (standard library only, they travel through Dask);
- :mod:`.models`: the SQLAlchemy tables and :data:`~.models.SCHEMA_VERSION`;
- :mod:`.store`: opening a catalog (path or URL), the schema check, SQLite's WAL
  mode, network filesystems and snapshots;
- :mod:`.record`: how events become rows;
- :mod:`.writer`: the one writer thread and its bounded queue, and the relay that
  sends an executor's events to the scheduler;
- :mod:`.plugin`: the scheduler plugin (event hub; the writer on a persistent
  cluster);
- :mod:`.queries`: what placement starts from, and what ``status`` and the monitor
  show;
- :mod:`.builder`: :class:`~.builder.CatalogBuilder`, to build catalogs for tests.

Who writes: with the embedded cluster (and on a Dask cluster this plugin did not
start), the executor process; on a cluster started by ``snakemake-context up``, the
scheduler plugin in that process, to which executors send their events through Dask.
A PostgreSQL (or any SQLAlchemy) URL may have several writers.
"""

from .events import TOPIC

__all__ = ["TOPIC"]
