"""Pilots: context servers started as batch jobs, from the request to the running pool.

- :mod:`.batch`: each batch system (one module each, behind one protocol), its name
  and walltime forms; the facts the settings check against, below them;
- :mod:`.request`: :class:`~.request.PilotOptions`, what a pilot asks of its batch
  system, and the dask-jobqueue arguments that submit it (a pure function);
- :mod:`.arguments`: the pilot options from ``up``'s command line or a run's
  settings, as :mod:`..settings.table` declares them;
- :mod:`.jobqueue`: the pilots' dask-jobqueue cluster, in the cluster process, each new
  pilot of the kind the demand asks for;
- :mod:`.pool`: the running pool, sized by the run's demand
  (:func:`~..fleet.poolsizing.pilots_wanted`, pure, stays in the fleet), and a
  pilot's end as its batch system tells it.

A pilot's own server process is :mod:`..server.pilot`. Above the settings and the
server's configuration; below the cluster, which starts a pool.
"""
