"""The Dask cluster the servers live in: starting it (its servers local, or a pool of
pilots, :mod:`..pilots`), attaching to it, and its hub.

- :mod:`.serve`: the cluster process (scheduler, hub and servers, or a pool of
  pilots), run as ``python -m snakemake_executor_context.cluster.serve serve``;
- :mod:`.hub`: the scheduler plugin, in the scheduler's process: the fleet's event
  hub, and the catalog's writer on a persistent cluster; :mod:`.roster`: gang
  pilots assembled there into servers that span nodes;
- :mod:`.plan`: which servers a local cluster starts, and their Dask settings (the
  fleet's shape, servers x slots x threads per slot, is :mod:`..settings.shape`);
- :mod:`.nannies`: the servers' nanny (exit codes, orphans, held restarts, a server
  that lost its scheduler started again);
  :mod:`.inject`: the preemption injector;
- :mod:`.process`: the cluster process seen from the one that starts or stops it;
  :mod:`.upcommand`: ``snakemake-context up``, its flags and the start;
  :mod:`.join`: ``snakemake-context join``, a node's servers against a running
  cluster; :mod:`.network`: where its processes listen (an interface, a route);
  :mod:`.infofiles`: the scheduler, pid, log and catalog files of a local cluster;
  :mod:`.info`: the cluster process's record of itself, in its pid file;
  :mod:`.credentials`: its TLS authority and certificate, and private files;
  :mod:`.floodguard`: what keeps every process of it serving its owner under a flood
  of connections (handshake deadlines, bounds, no HTTP listener);
- :mod:`.attach`: where a client attaches, checked in one line;
  :mod:`.connection`: the executor's connection (a client, and the embedded cluster
  if the run owns one).

Imports the servers' plugin (to start servers), the catalog (the hub writes it) and
the fleet's vocabulary; never the executor.
"""
