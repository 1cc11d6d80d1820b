"""A Snakemake scheduler plugin for the stopping tests (``--scheduler slowpick``):
Snakemake's greedy selector, made slow, that says when it is selecting.

Snakemake's scheduler selects jobs holding its lock in the main thread; at thousands
of ready jobs the default (ILP) selector's solve takes a good part of a second, and a
SIGTERM landing then met that lock (tests/e2e/test_interrupt.py). Each selection here
takes ``$SLOWPICK_SECONDS`` (default 0.3) and exists as the file ``$SLOWPICK_MARK``
while it runs, so a test can send its signal inside a selection, or outside one.
Found by Snakemake's plugin discovery when this folder is on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from snakemake.scheduling.greedy import Scheduler as GreedyScheduler
from snakemake.scheduling.greedy import SchedulerSettings

__all__ = ["Scheduler", "SchedulerSettings"]


class Scheduler(GreedyScheduler):
    """The greedy selector, slow, marking each selection with a file."""

    def select_jobs(self, *args: Any, **kwargs: Any) -> Any:
        mark = Path(os.environ["SLOWPICK_MARK"])
        mark.touch()
        try:
            time.sleep(float(os.environ.get("SLOWPICK_SECONDS", "0.3")))
            return super().select_jobs(*args, **kwargs)
        finally:
            mark.unlink(missing_ok=True)
