"""The servers' limits an executor hands its embedded cluster: checked at start (one
line naming the setting), then passed through the environment the cluster's
processes inherit (the variables a user exports for `snakemake-context up`)."""

from __future__ import annotations

import os

from ..defaults import MEMORY_CAP_VARIABLE, RECYCLE_VARIABLE
from ..errors import ContextExecutorError
from ..fleet.resources import parse_memory_cap
from .settings import ExecutorSettings

__all__ = ["export_server_limits"]


def export_server_limits(settings: ExecutorSettings) -> None:
    """Check --context-memory-cap and --context-recycle-after-leaks and set them for
    the embedded cluster's servers. Raises ContextExecutorError on a bad value."""
    if settings.memory_cap is not None:
        try:
            parse_memory_cap(settings.memory_cap)
        except ValueError as error:
            raise ContextExecutorError(
                f"--context-memory-cap {settings.memory_cap!r}: {error}."
            ) from None
        os.environ[MEMORY_CAP_VARIABLE] = settings.memory_cap
    leaks = settings.recycle_after_leaks
    if not isinstance(leaks, int) or leaks < 0:
        raise ContextExecutorError(
            f"--context-recycle-after-leaks {leaks!r}: give a count of jobs, 0 or more "
            "(0: never restart a server for leaked threads)."
        )
    os.environ[RECYCLE_VARIABLE] = str(leaks)
