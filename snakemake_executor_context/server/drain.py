"""Graceful drain: what a server does on SIGTERM (a batch system's preemption
notice, e.g. SLURM's ``--signal=B:TERM@N``, or its ``scancel``).

It takes no new job, finishes each running job whose expected remaining time fits
the grace period (:func:`..fleet.losses.finishes_in_grace`: the mean time of that
context's jobs on this server, minus what the job ran; unknown means hand back),
waits until the executor has fetched its result, hands the others back at once,
says so (:class:`..fleet.events.ServerDraining`, which the hub turns into a
preemption: the jobs handed back cost their preemption budget, never a retry) and
exits. Its nanny may start it again (the embedded cluster, ``up``); a batch
system's node simply goes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from ..fleet import events as ev
from ..fleet.losses import finishes_in_grace

if TYPE_CHECKING:
    from .server import ContextServer

__all__ = ["DEFAULT_GRACE", "install_drain"]

#: Seconds between SIGTERM and the end: SLURM's default KillWait.
DEFAULT_GRACE = 30.0
#: Exit code of a drained server.
DRAINED_EXIT = 0

logger = logging.getLogger(__name__)


def install_drain(worker: Any, server: ContextServer, grace: float) -> None:
    """Drain on SIGTERM (call in the process's main thread)."""

    def on_term(signum: int, frame: Any) -> None:
        if not server.draining:
            server.draining = True
            threading.Thread(target=_drain, args=(worker, server, grace), daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)


def _drain(worker: Any, server: ContextServer, grace: float) -> None:
    began = time.monotonic()
    now = time.time()
    finishing, handed_back = [], []
    for key, job in server.running_jobs().items():
        mean = server.mean_job_seconds(job.identity)
        if finishes_in_grace(mean, now - job.started, grace):
            finishing.append(key)
        else:
            handed_back.append(key)
    server.emit(
        ev.ServerDraining(
            address=server.identity.address,
            name=server.identity.name,
            grace=grace,
            finishing=finishing,
            handed_back=handed_back,
        )
    )
    logger.warning(
        "SIGTERM: draining; finishing %s, handing back %s (grace %.0f s)",
        finishing,
        handed_back,
        grace,
    )
    deadline = began + max(0.0, grace - 2.0)
    if not handed_back:
        for key in finishing:
            server.wait_done(key, deadline - time.monotonic())
            _wait_fetched(worker, key, deadline)
    server.groups.kill_all(keep_running=True)
    time.sleep(0.3)  # let the batched stream carry the last events
    os._exit(DRAINED_EXIT)


def _wait_fetched(worker: Any, key: str, deadline: float) -> None:
    """Until the executor has taken the job's result (the worker forgets the task),
    or the deadline."""
    while time.monotonic() < deadline:
        if key not in worker.state.tasks:
            return
        time.sleep(0.05)
