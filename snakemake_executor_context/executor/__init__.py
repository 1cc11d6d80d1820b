"""What runs in Snakemake's process: the executor plugin.

- :mod:`.adapter`: :class:`~.adapter.Executor`, the ``RemoteExecutor`` Snakemake
  talks to (thin: stimuli in, commands out);
- :mod:`.dispatch` and :mod:`.vocabulary`: the dispatch state machine and what it
  takes and returns (pure: no Dask, no Snakemake); :mod:`.demand`: the work still to
  come per context, which placement weighs against a load;
- :mod:`.tasks`: the attempts' Dask futures; :mod:`.results`: what a finished one says;
- :mod:`.jobbuild`: a Snakemake job as a ticket and a spec; :mod:`.rulecheck`: the
  checks at start; :mod:`.settings`: the ``--context-*`` settings;
- :mod:`.recording`: the run's catalog side; :mod:`.summary`: the run summary;
  :mod:`.startup` and :mod:`.wake`: connecting, and waking the status loop.

Importing this package is cheap: Snakemake imports the discovery shim, and so
:mod:`.settings`, on every start.
"""
