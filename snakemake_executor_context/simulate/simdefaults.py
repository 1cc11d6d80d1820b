"""What a user of the plugin gets without setting anything, as the simulator models it:
read from the declared options (:mod:`..settings.table`, whose defaults the executor's
settings take) and, for the executor's own, from its settings
(:class:`~..executor.settings.ExecutorSettings`), never typed again here, so that a
simulation with the defaults predicts a run with them and follows them when they
change.
"""

from __future__ import annotations

from ..executor.settings import Tuning
from ..pilots.batch.walltime import read_walltime
from ..settings.table import setting_default

__all__ = [
    "LIFETIME_STAGGER",
    "LOADS_PER_SOURCE",
    "MAX_PILOTS",
    "MIN_PILOTS",
    "PEER_TRANSFERS",
    "PILOT_IDLE_TIMEOUT",
    "PILOT_WALLTIME",
    "RETIRE_MARGIN",
    "SLOTS",
    "WAIT_FOR_SERVER",
]

#: Jobs a server runs at once (``--context-slots``).
SLOTS: int = int(setting_default("slots"))
#: Pilots the pool keeps, and its most (``--context-pilots min``, ``--context-pilots max``).
MIN_PILOTS: int = int(setting_default("min_pilots"))
MAX_PILOTS: int = int(setting_default("max_pilots"))
#: A pilot's walltime in seconds (``--context-pilots walltime``: its default reads alike
#: in every batch system), how long before it a pilot retires
#: (``--context-tuning pilot_retire_margin``), and up to how much earlier at random.
PILOT_WALLTIME: float = float(read_walltime("slurm", setting_default("pilot_walltime")).seconds)
RETIRE_MARGIN: float = float(setting_default("pilot_retire_margin"))
LIFETIME_STAGGER: float = float(setting_default("pilot_lifetime_stagger"))
#: Seconds an idle pilot is kept (``--context-tuning pilot_idle_timeout``).
PILOT_IDLE_TIMEOUT: float = float(setting_default("pilot_idle_timeout"))
#: Pilots loading one context from its shared source at once
#: (``--context-tuning pilot_loads_per_source``; 0: no limit).
LOADS_PER_SOURCE: int = int(setting_default("pilot_loads_per_source"))
#: Transfers of a template each server serves to its peers at once
#: (``--context-tuning peer_transfers``; 0: no peer transfer, every load reads its source).
PEER_TRANSFERS: int = int(setting_default("peer_transfers"))
#: Seconds a job waits for a server that can run it, outside a pool
#: (``--context-tuning wait_for_server``, the executor's own; a pool's jobs wait as long as
#: its queue takes).
WAIT_FOR_SERVER: float = float(Tuning.wait_for_server)
