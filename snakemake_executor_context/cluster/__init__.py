"""The Dask cluster the servers live in: starting it, attaching to it, its hub.

- :mod:`.serve`: the cluster process (scheduler, hub and servers), run as
  ``python -m snakemake_executor_context.cluster.serve serve``;
- :mod:`.hub`: the scheduler plugin, in the scheduler's process: the fleet's event
  hub, and the catalog's writer on a persistent cluster;
- :mod:`.plan`: which servers a local cluster starts, and their Dask settings;
- :mod:`.process`: the cluster process seen from the one that starts or stops it;
- :mod:`.files`: the scheduler, pid, log and catalog files of a local cluster;
- :mod:`.connection`: the executor's connection (a client, and the embedded cluster
  if the run owns one).

Imports the servers' plugin (to start servers), the catalog (the hub writes it) and
the fleet's vocabulary; never the executor.
"""
