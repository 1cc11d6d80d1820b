"""Graceful drain, the decision: which running jobs a server finishes after SIGTERM
(a batch system's preemption notice, e.g. SLURM's ``--signal=B:TERM@N``, or its
``scancel``) and which it hands back.

A job is finished when its expected remaining time fits the grace period
(:func:`..fleet.losses.finishes_in_grace`: the mean time of that context's jobs on
this server, minus what the job ran; unknown means hand back). The server carries it
out (:meth:`.server.ContextServer.drain`): it takes no new job, says so
(:class:`..fleet.events.ServerDraining`, which the hub turns into a preemption: the
jobs handed back cost their preemption budget, never a retry), waits for the jobs it
finishes until the executor has their results, and leaves. Its nanny may start it
again (the embedded cluster, ``up``); a batch system's node simply goes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..fleet.losses import finishes_in_grace

__all__ = ["DRAINED_EXIT", "plan_drain"]

#: Exit code of a drained server.
DRAINED_EXIT = 0


def plan_drain(
    running: Mapping[str, tuple[str | None, float]],
    mean_seconds: Callable[[str | None], float | None],
    now: float,
    grace: float,
) -> tuple[list[str], list[str]]:
    """(finishing, handed back) among ``running`` (key -> (context identity, start));
    ``mean_seconds(identity)`` is this server's mean job time of that context."""
    finishing: list[str] = []
    handed_back: list[str] = []
    for key, (identity, started) in running.items():
        fits = finishes_in_grace(mean_seconds(identity), now - started, grace)
        (finishing if fits else handed_back).append(key)
    return finishing, handed_back
