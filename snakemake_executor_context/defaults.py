"""Where the plugin keeps its files, and what its settings default to: each fact once.

Standard library only: the discovery shim's settings, the CLI, the cluster process
and the servers all read it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "CATALOG_OFF",
    "CONTEXT_DIR",
    "DEFAULT_CATALOG",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_SCHEDULER_FILE",
    "catalog_disabled",
]

#: Where the executor keeps its files in the workflow directory (logs, runs, cluster).
CONTEXT_DIR = Path(".snakemake") / "context"
#: A run's catalog, relative to the workflow directory, unless told otherwise.
DEFAULT_CATALOG = CONTEXT_DIR / "catalog.db"
#: What a server may fill with contexts: a fraction of its memory, or a size ("6GB").
DEFAULT_MEMORY_BUDGET = "0.8"
#: The scheduler file of `snakemake-context up` (its log, pid file and catalog beside it).
DEFAULT_SCHEDULER_FILE = Path(
    os.environ.get("SNAKEMAKE_CONTEXT_SCHEDULER_FILE", "~/.snakemake-context/scheduler.json")
).expanduser()
#: The words that turn the catalog off (``--context-catalog none``).
CATALOG_OFF = ("none", "off", "no", "false")


def catalog_disabled(spec: str | None) -> bool:
    """Whether a catalog setting turns recording off."""
    return spec is not None and spec.strip().lower() in CATALOG_OFF
