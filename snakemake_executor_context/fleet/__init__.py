"""The fleet: what every process of the system says about servers, contexts and jobs.

The bottom of the import graph. Standard library only, no I/O, importing nothing
else of this project: the Snakemake process (executor), the scheduler (hub), the
servers and the catalog all import it, and it imports none of them.

- :mod:`.events`: the event vocabulary, the wire protocol of the fleet;
- :mod:`.outcome`: the one record of what an attempt did on its server;
- :mod:`.keys`: the Dask keys of job attempts;
- :mod:`.gpus`: GPU records and model names;
- :mod:`.resources`: what a job needs and what a server offers;
- :mod:`.eviction`: which loaded contexts make room for a new one (servers evict by
  it, placement predicts with it);
- :mod:`.losses`: why a server was lost, and the budgets each loss is charged to;
- :mod:`.measure`: measured job and load times (loads that convert apart from loads
  from a cache);
- :mod:`.servers`: :class:`~.servers.ServerState`, one server as the fleet sees it;
- :mod:`.state`: :class:`~.state.FleetState`, the in-memory view of the fleet, with
  :mod:`.index`: the candidates per wanted resources and the servers by free slots,
  so that placement does not scan every server;
- :mod:`.placement`: the placement policy, as pure functions of that view;
- :mod:`.survival`: how long a server is likely to live (Kaplan-Meier over the lives
  seen, per group), which placement and the pool may weigh;
- :mod:`.poolsizing` and :mod:`.pilotbook`: how many pilots a pool holds, and its books;
  :mod:`.pilotkinds`: what each kind of pilot can run, once one has registered;
- :mod:`.loads`: the kinds of context load (conversion, local cache, source, peer);
  :mod:`.peerchoice`: a template from a peer or from the source, by measured rates;
- :mod:`.buckets`: the ledger's buckets, where a GPU-second went (one name each);
- :mod:`.accounting`: the ledger's accounting, a server's life cut into those buckets, over
  :mod:`.intervals` (sets of time intervals).
"""
