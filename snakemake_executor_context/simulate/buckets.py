"""Where a GPU-second goes: the ledger's buckets and the kinds of load, the fleet's own
(:mod:`..fleet.buckets`, :mod:`..fleet.loads`), so that the simulator's predictions
and the ledger's accounts of real runs use one vocabulary and compare line by line."""

from __future__ import annotations

from ..fleet.buckets import Bucket
from ..fleet.loads import LoadKind

__all__ = ["Bucket", "LoadKind"]
