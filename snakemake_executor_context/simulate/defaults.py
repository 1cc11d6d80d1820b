"""What a user of the plugin gets without setting anything, as the simulator models it:
read from the executor's declared settings (:class:`~..executor.settings.ExecutorSettings`
and its pilot settings), never typed again here, so that a simulation with the
defaults predicts a run with them and follows them when they change.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from ..executor.settings import ExecutorSettings

__all__ = ["LOADS_PER_SOURCE", "PEER_TRANSFERS", "setting_default"]


def setting_default(name: str) -> Any:
    """The declared default of the executor's setting ``name`` (its field's name)."""
    for declared in fields(ExecutorSettings):
        if declared.name == name:
            if declared.default is MISSING:
                raise LookupError(f"the executor's setting {name!r} declares no default")
            return declared.default
    raise LookupError(f"the executor has no setting {name!r}")


#: Pilots loading one context from its shared source at once
#: (``--context-pilot-loads-per-source``; 0: no limit).
LOADS_PER_SOURCE: int = int(setting_default("pilot_loads_per_source"))
#: Whether a server that lacks a context's template fetches it from a peer that holds
#: it (``--context-peer-transfers`` above 0: each server serves that many at once).
PEER_TRANSFERS: bool = int(setting_default("peer_transfers")) > 0
