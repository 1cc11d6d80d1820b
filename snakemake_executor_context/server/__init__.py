"""What runs inside a context server: a Dask worker process that holds contexts.

- :mod:`.plugin`: the worker plugin that makes a worker a server, and the functions
  the executor runs on servers (``execute_job``, ``cancel_jobs``, ...);
- :mod:`.server`: :class:`~.server.ContextServer`, the process's jobs and events;
- :mod:`.cache`: the loaded contexts, their budget and eviction;
- :mod:`.inprocess`: a context job's script run in this process, and
  :mod:`.isolation`, what it may change here and how that is undone;
- :mod:`.plain`: a plain job as Snakemake's own job command;
- :mod:`.running`: the handle cancellation goes through;
- :mod:`.nvml`: the server's GPU, through NVML.

Imports the fleet's vocabulary and the shared job specs; never the executor, the
cluster or the catalog.
"""
