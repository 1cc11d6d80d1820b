"""One server as the fleet sees it: what it advertises, holds and runs.

The one server type of the fleet (the catalog has its rows, a server process its own
record); :class:`~.state.FleetState` keeps one per server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .gpus import normalize_gpu_model
from .resources import describe_offer, model_from_resources

__all__ = ["CPU_MODEL", "ContextState", "Placed", "ServerState", "model_of"]

#: The GPU model of a server without a GPU.
CPU_MODEL = "cpu"


class ContextState(StrEnum):
    """Where a context stands on a server."""

    LOADING = "loading"
    READY = "ready"


def model_of(resources: Mapping[str, float], gpu: Mapping[str, Any] | None = None) -> str:
    """A server's normalised GPU model: from its GPU record, else the most specific
    ``gpu_model:`` resource it advertises, else :data:`CPU_MODEL`."""
    if gpu and gpu.get("name"):
        return normalize_gpu_model(str(gpu["name"]))
    return model_from_resources(resources) or CPU_MODEL


@dataclass
class Placed:
    """A context on a server: loading or ready, since when, and its size."""

    state: ContextState
    at: float
    bytes: int = 0
    last_used: float = 0.0


@dataclass
class ServerState:
    """One server: what it advertises, holds and runs. The one server type of the
    fleet (the catalog has its rows, the server process its own record)."""

    address: str
    name: str = ""
    resources: dict[str, float] = field(default_factory=dict)
    slots: int = 1
    gpu_model: str = CPU_MODEL
    gpu: dict[str, Any] | None = None
    #: Bytes the server may fill with contexts (None: not yet described).
    budget: int | None = None
    contexts: dict[str, Placed] = field(default_factory=dict)
    #: Identities whose weights its local disk holds (the loaders' cache probes).
    cached: set[str] = field(default_factory=set)
    #: Keys holding a slot there -> the context each runs (None: a plain job), and
    #: when each started (absent until it has).
    holding: dict[str, str | None] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    #: Held keys whose context cannot be shared: each holds every slot.
    exclusive: set[str] = field(default_factory=set)
    #: Jobs of each context it runs at once, as it said (ContextShared).
    shared: dict[str, int] = field(default_factory=dict)
    #: When each context was last evicted (a late "ready" from before does not count).
    gone: dict[str, float] = field(default_factory=dict)
    #: When it retires (a pilot, before its walltime); None: not planned.
    retires_at: float | None = None
    #: Nodes its devices are on (a server assembled from pilots on several nodes),
    #: and, for a member of such a server, its leader (it runs no job itself).
    nodes: int = 1
    member_of: str | None = None

    @property
    def busy(self) -> int:
        """Slots in use (jobs running or dispatched there; all of them while a job
        of an unshareable context holds one)."""
        return max(self.slots, len(self.holding)) if self.exclusive else len(self.holding)

    @property
    def free(self) -> bool:
        """Whether a slot is free."""
        return self.busy < self.slots

    def describe(self) -> str:
        """'gpu0 (gpu=1, h200, mem_mb=12000)'."""
        return f"{self.name or self.address} ({describe_offer(self.resources)})"
