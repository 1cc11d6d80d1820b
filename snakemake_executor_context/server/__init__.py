"""What runs inside a context server: a Dask worker process that holds contexts.

- :mod:`.plugin`: the worker plugin that makes a worker a server; :mod:`.calls`: the
  functions the executor runs on servers (``execute_job``, ``cancel_jobs``, ...),
  which Snakemake's process pickles by name without importing the rest; :mod:`.pilot`:
  the preload that makes a pilot's worker one; :mod:`.config`: how a server is set up;
- :mod:`.server`: :class:`~.server.ContextServer`, the process's contexts, events and
  its one way out; :mod:`.outbox`: its events, sent one message a tick; :mod:`.jobs`:
  its jobs, each under its limits' watch; the one-decision policies they ask,
  together in :mod:`.policy` (a drain on SIGTERM, a CUDA-fatal error, a broken runtime
  or memory cap), with :mod:`.memwatch` sampling the memory;
- :mod:`.cache`: the loaded contexts, their budget and eviction; :mod:`.inventory`: what
  a server says of itself when asked (its typed record); :mod:`.templates`:
  a context's template around each load (the cache probe, the check that moves a
  damaged entry aside, its events); :mod:`.loadturns`: turns to load from a shared
  source;
- :mod:`.peers`: peer-to-peer transfer of context templates (a package: the
  receiver, the survey of holders, the holder, how a server reaches its peers, and
  the records of their calls);
- :mod:`.contextjob`: a context job's way through its slot and its contexts;
  :mod:`.groupjob`: a Snakemake group's members, layer by layer, on one server;
  :mod:`.slots`: which jobs run at once (the gate, what they share, memory);
- :mod:`.inprocess`: a context job's script run in this process, :mod:`.isolation`,
  what it may change here and how that is undone (:mod:`.processwide`: the umask,
  rlimits and the like), :mod:`.output`, where its output goes, and
  :mod:`.scriptchild`, what its ``spawn``/``forkserver`` children run first;
- :mod:`.plain`: a plain job as Snakemake's own job command, forked from the
  :mod:`.zygote`, whose Snakemake ends a failed pipe group (:mod:`.pipegroups`);
  what they and in-process jobs leave running is swept by :mod:`..strays`;
- :mod:`.running`: the handle cancellation goes through;
- :mod:`.nvml`: the server's GPU, through NVML;
- :mod:`.gangsite`: a pilot's part in a server that spans nodes (its gang's roster,
  and the relays between the leader and the ranks on its members).

Imports the fleet's vocabulary and the shared job specs; never the executor, the
cluster or the catalog.
"""
