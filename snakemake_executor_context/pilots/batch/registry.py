"""The batch systems pilots can be submitted to, by their ``--backend`` name."""

from __future__ import annotations

from ...errors import ClusterError
from .htcondor import HTCondor
from .lsf import Lsf
from .pbs import Pbs
from .sge import Sge
from .slurm import Slurm
from .system import BatchSystem

__all__ = ["BACKENDS", "batch_state", "batch_system"]

#: Every batch system, by its ``--backend`` name.
BACKENDS: dict[str, BatchSystem] = {
    system.name: system for system in (Slurm(), HTCondor(), Pbs(), Sge(), Lsf())
}


def batch_system(name: str) -> BatchSystem:
    """The batch system of this ``--backend`` name (ClusterError naming the choices)."""
    system = BACKENDS.get(name)
    if system is None:
        raise ClusterError(
            f"--backend (--context-pilots backend) {name!r} is not a batch system this plugin "
            f"knows: choose one of {', '.join(sorted(BACKENDS))}."
        )
    return system


def batch_state(backend: str, job_id: str) -> str | None:
    """The final state of a pilot's batch job, in SLURM's words (None while it has
    none, for an unknown backend, or where its batch system is not read)."""
    system = BACKENDS.get(backend)
    return system.end_state(job_id) if system is not None and job_id else None
