"""The fleet: what every process of the system says about servers, contexts and jobs.

The bottom of the import graph. Standard library only, no I/O, importing nothing
else of this project: the Snakemake process (executor), the scheduler (hub), the
servers and the catalog all import it, and it imports none of them.

- :mod:`.events`: the event vocabulary, the wire protocol of the fleet;
- :mod:`.keys`: the Dask keys of job attempts;
- :mod:`.gpus`: GPU records and model names;
- :mod:`.resources`: what a job needs and what a server offers;
- :mod:`.eviction`: which loaded contexts make room for a new one (servers evict by
  it, placement predicts with it);
- :mod:`.measure`: measured job and load times (loads that convert apart from loads
  from a cache);
- :mod:`.servers`: :class:`~.servers.ServerState`, one server as the fleet sees it;
- :mod:`.state`: :class:`~.state.FleetState`, the in-memory view of the fleet;
- :mod:`.placement`: the placement policy, as pure functions of that view.
"""
