"""Black-hole servers, the decision: which failed job's error makes its server
unusable.

After a CUDA-fatal error (an illegal memory access, an Xid, an uncorrectable ECC
error) every later job on that GPU would fail, so such an error recycles the server
(:meth:`.server.ContextServer.recycle`): it takes no new job, waits until its failed
job's result has been taken, says why (:class:`..fleet.events.ServerDraining`) and
exits, and its nanny starts a fresh process. A CUDA out-of-memory error is an
exception, not a death: the allocator's cache is freed and the error counted.
"""

from __future__ import annotations

import re

__all__ = ["CUDA_FATAL", "CUDA_OOM", "RECYCLE_GRACE", "gpu_failure"]

#: Error texts after which the CUDA context (and so the server) is unusable.
CUDA_FATAL = re.compile(
    r"illegal memory access|illegal instruction was encountered|unspecified launch "
    r"failure|uncorrectable ECC|ECC error|\bXid\b|device-side assert|misaligned address|"
    r"CUDA error: unknown error|CUBLAS_STATUS_EXECUTION_FAILED",
    re.IGNORECASE,
)
#: Error texts of a CUDA allocation failure (recoverable).
CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError: CUDA", re.IGNORECASE)
#: Seconds a recycling server waits for the jobs running beside the one that made it
#: recycle (slots) before it exits.
RECYCLE_GRACE = 60.0


def gpu_failure(text: str) -> str | None:
    """'fatal', 'oom' or None for a failed job's message."""
    if CUDA_FATAL.search(text):
        return "fatal"
    if CUDA_OOM.search(text):
        return "oom"
    return None
