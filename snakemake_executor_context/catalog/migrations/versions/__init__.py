"""The catalog's migrations, oldest first; each module's ``revision`` is its number
and its ``down_revision`` the one before.

- :mod:`.v0001_schema_one`: the tables of schema version 1 (release 0.1), as that
  release created them;
- :mod:`.v0002_job_stories`: the story of a job: each attempt's log and stimulus, the
  report's stimulus and message, and the ``job_story`` table;
- :mod:`.v0003_ledger`: the ledger's facts: servers' GPUs, drains and batch
  allocations, loads' conversions, the ``forward_batches`` and ``pilots`` tables;
- :mod:`.v0004_transfers`: peer-to-peer transfer: loads' seconds from peers, and the
  ``transfers`` table;
- :mod:`.v0005_gangs`: gangs: a placement's ranks and members (``placements.ranks``,
  ``placements.gang``);
- :mod:`.v0006_damaged_entries`: the model-cache entries servers found damaged and
  moved aside (the ``damaged_entries`` table);
- :mod:`.v0007_job_outputs`: each job's output files (the ``job_outputs`` table);
- :mod:`.v0008_server_lives`: each server's partition, pool and group, and what ended it.
"""
