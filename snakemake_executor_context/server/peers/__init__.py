"""Peer-to-peer transfer of context templates, between the servers of one cluster.

- :mod:`.receiver`: the receiver, which fetches a missing template before a load;
- :mod:`.survey`: which holder it fetches from, or whether it reads the source: every
  other server asked at once, the fleet hub's measured rates, and the pure choice
  (:func:`...fleet.peerchoice.choose_origin`) obeyed;
- :mod:`.holder`: what a server serves to its peers (on its own TLS port);
- :mod:`.reach`: how a server reaches its peers and the hub's rates through Dask;
- :mod:`.wire`: the records their calls carry, each with its ``to_wire`` and
  ``from_wire``.

Runs in a context server's process; imports the server's output and template
modules, the fleet's vocabulary and the model cache, never the executor.
"""
