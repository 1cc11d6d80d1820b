"""The catalog: the project's record of where every context lives and what the fleet
did.

Storage only: the events it records are the fleet's vocabulary
(:mod:`..fleet.events`), which the catalog imports and never the reverse.

Modules (import them directly; this package imports nothing heavy):

- :mod:`.models`: the SQLAlchemy tables and :data:`~.models.SCHEMA_VERSION`;
- :mod:`.migrations`: the schema's versions (Alembic), an older catalog upgraded in
  place by its writer;
- :mod:`.store`: opening a catalog (path or URL), the schema check, SQLite's WAL
  mode, network filesystems and snapshots;
- :mod:`.record`: how events become rows;
- :mod:`.writer`: the one writer thread, and how a run or a cluster opens it;
  :mod:`.lease`: one writer per SQLite catalog; :mod:`.follow`: a SQLite catalog
  deleted or replaced under its writer; :mod:`.sinks`: the bounded queue
  and thread a writer is, and the relay that sends an executor's events to the
  scheduler's writer instead;
- queries, one module per reader: :mod:`.seed` (what a run's placement starts
  from), :mod:`.queries` (``snakemake-context status``, printed by
  :mod:`.overview_text`), :mod:`.monitor_queries` (the terminal monitor: only what
  changed since its last poll), :mod:`.history` (runs, losses and jobs, which both
  ``status`` and the monitor show), :mod:`.gangs` (the contexts spanning several
  processes held now, which both show too), :mod:`.story` (the story of one job:
  ``snakemake-context story`` and the monitor's server page), :mod:`.ledger` (where
  every GPU-second went: the report and its export), :mod:`.ledger_live` (the same,
  live, for the monitor), :mod:`.report_queries` (the rest of the report) and
  :mod:`.lives` (servers' lives: each live server's expected life left, which
  ``status`` and the monitor show, and a run's lives against the prediction, in the
  report).

Who writes: with the embedded cluster (and on a Dask cluster this plugin did not
start), the executor process; on a cluster started by ``snakemake-context up``, the
fleet's hub in the scheduler's process (:mod:`..cluster.hub`), to which executors
send their events through Dask. A PostgreSQL (or any SQLAlchemy) URL may have several
writers.
"""
