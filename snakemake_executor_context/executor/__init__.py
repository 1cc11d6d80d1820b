"""What runs in Snakemake's process: the executor plugin.

- :mod:`.adapter`: :class:`~.adapter.Executor`, the ``RemoteExecutor`` Snakemake
  talks to (thin: stimuli in, commands out), which feeds the dispatch machine
  (:mod:`..dispatch`) and carries out its commands;
- :mod:`.tasks`: the attempts' Dask futures; :mod:`.results`: what a finished one says;
  :mod:`.pacing`: when finished jobs are told to Snakemake (together, while work is queued);
- :mod:`.jobbuild`: a Snakemake job as a ticket and a spec; :mod:`.rulecheck`: the
  checks at start; :mod:`.settings`: the one settings class, every ``--context-*`` flag (the
  pilot request and the tuning keys among them), each declaring what it allows;
- :mod:`.localjobs`: plain rules run in Snakemake's process, and their watchdog;
- :mod:`.recording`: the run's catalog side; :mod:`.summary`: the run summary;
  :mod:`.startup`: connecting (and handing the embedded cluster's servers their
  limits), and how long each step of the start took (``--verbose``);
  :mod:`.announce`: what the run says of its fleet at start;
- :mod:`.loop`: the status loop's helpers: waking it from any thread, the fleet's
  events as stimuli, the periodic fleet check, the servers' cache probes asked in the
  background;
- :mod:`.stopping`: Ctrl-C and SIGTERM where Snakemake's own handling does not reach
  (before its scheduler runs, after its loop ends, a second press while one stops) and
  a Ctrl-C Snakemake's main thread swallowed, raised again.

Importing this package is cheap: Snakemake imports the discovery shim, and so
:mod:`.settings`, on every start.
"""
