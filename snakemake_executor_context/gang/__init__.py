"""Contexts that span several processes: one rank per device, in one
``torch.distributed`` group (tensor parallelism), whole or lost together.

Runs in the process that holds such a context (a context server, or a job's own
process under another executor) and in the rank processes it starts:

- :mod:`.start`: :func:`~.start.start_gang` starts the ranks on the devices
  :class:`~.start.GangOptions` names and loads their shards;
- :mod:`.driver`: :class:`~.driver.Gang`, the one way to call them (its calls
  serialised: the same collectives in the same order on every rank), which says once
  when a rank dies;
- :mod:`.rank`: :class:`~.rank.Rank`, what a shard loader gets, and the rank process's
  ``main``, which ``__main__`` runs (``python -m snakemake_executor_context.gang``);
- :mod:`.rendezvous`: the rendezvous, kept by the driver and reached over each rank's own
  connection to it (no listener, no file);
- :mod:`.devices`: the devices a process owns (:func:`~.devices.server_devices`), for
  a loader that splits a model over them itself (``device_map="auto"``) and for a
  gang's ranks.

Standard library only at import; torch is imported in the rank processes.
"""

from .devices import server_devices
from .driver import Gang, RankLoss
from .rank import Rank
from .start import GangOptions, start_gang

__all__ = ["Gang", "GangOptions", "Rank", "RankLoss", "server_devices", "start_gang"]
