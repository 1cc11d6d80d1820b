"""Black-hole servers: after a CUDA-fatal error (an illegal memory access, an Xid,
an uncorrectable ECC error) every later job on that GPU would fail, so such an error
recycles the server: it takes no new job, waits until its failed job's result has
been taken, says why (:class:`..fleet.events.ServerDraining`) and exits, and its
nanny starts a fresh process. A CUDA out-of-memory error is an exception, not a
death: the allocator's cache is freed and the error counted.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from ..fleet import events as ev

if TYPE_CHECKING:
    from .server import ContextServer

__all__ = ["CUDA_FATAL", "CUDA_OOM", "gpu_failure", "recycle"]

#: Error texts after which the CUDA context (and so the server) is unusable.
CUDA_FATAL = re.compile(
    r"illegal memory access|illegal instruction was encountered|unspecified launch "
    r"failure|uncorrectable ECC|ECC error|\bXid\b|device-side assert|misaligned address|"
    r"CUDA error: unknown error|CUBLAS_STATUS_EXECUTION_FAILED",
    re.IGNORECASE,
)
#: Seconds a recycling server waits for the jobs running beside the one that made it
#: recycle (slots) before it exits.
RECYCLE_GRACE = 60.0
#: Error texts of a CUDA allocation failure (recoverable).
CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError: CUDA", re.IGNORECASE)

logger = logging.getLogger(__name__)


def gpu_failure(text: str) -> str | None:
    """'fatal', 'oom' or None for a failed job's message."""
    if CUDA_FATAL.search(text):
        return "fatal"
    if CUDA_OOM.search(text):
        return "oom"
    return None


def recycle(worker: Any, server: ContextServer, key: str, why: str) -> None:
    """Take no new job; once job ``key``'s result is taken (30 s at most), leave."""
    server.draining = True

    def leave() -> None:
        deadline = time.monotonic() + 30.0
        while worker is not None and time.monotonic() < deadline:
            if key not in worker.state.tasks:
                break
            time.sleep(0.05)
        # Jobs running beside it in other slots may finish first (within the grace);
        # what is still running then is lost with the server and rerun elsewhere.
        deadline = time.monotonic() + RECYCLE_GRACE
        while time.monotonic() < deadline and set(server.running_jobs()) - {key}:
            time.sleep(0.1)
        server.emit(
            ev.ServerDraining(address=server.identity.address, name=server.identity.name, why=why)
        )
        logger.error("recycling this server: %s", why)
        server.groups.kill_all()
        time.sleep(0.3)  # let the batched stream carry the event
        os._exit(0)

    threading.Thread(target=leave, daemon=True).start()
