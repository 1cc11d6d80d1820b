"""The catalog's readers, one module per thing read; none imports the write side.

- :mod:`.fleetseed`: the fleet state a run's placement starts from;
- :mod:`.status`: the fleet, runs and contexts of ``snakemake-context status``,
  printed by :mod:`.overview`;
- :mod:`.monitoring`: what the terminal monitor polls (only what changed since its
  last poll);
- :mod:`.history`: runs, losses and jobs, which both ``status`` and the monitor show;
- :mod:`.gangs`: the contexts spanning several processes held now;
- :mod:`.stories`: the story of one job (``snakemake-context story``, the monitor's
  server page);
- :mod:`.ledger`: where every GPU-second went (the report and its export), and
  :mod:`.liveledger`: the same, live, for the monitor;
- :mod:`.reportdata`: the rest of the run report;
- :mod:`.lives`: servers' lives: each live server's expected life left, and a run's
  lives against the prediction.
"""
