"""The catalog: the project's record of where every context lives and what the fleet
did.

Storage only: the events it records are the fleet's vocabulary
(:mod:`..fleet.events`), which the catalog imports and never the reverse.

Modules (import them directly; this package imports nothing heavy):

- :mod:`.models`: the SQLAlchemy tables and :data:`~.models.SCHEMA_VERSION`;
- :mod:`.store`: opening a catalog (path or URL), the schema check, SQLite's WAL
  mode, network filesystems and snapshots;
- :mod:`.record`: how events become rows;
- :mod:`.writer`: the one writer thread and its bounded queue, and the relay that
  sends an executor's events to the scheduler;
- queries, one module per reader: :mod:`.seed` (what a run's placement starts
  from), :mod:`.queries` (``snakemake-context status``), :mod:`.monitor_queries` (the
  terminal monitor: only what changed since its last poll), and :mod:`.history`
  (runs, losses and jobs, which both ``status`` and the monitor show).

Who writes: with the embedded cluster (and on a Dask cluster this plugin did not
start), the executor process; on a cluster started by ``snakemake-context up``, the
fleet's hub in the scheduler's process (:mod:`..cluster.hub`), to which executors
send their events through Dask. A PostgreSQL (or any SQLAlchemy) URL may have several
writers.
"""
