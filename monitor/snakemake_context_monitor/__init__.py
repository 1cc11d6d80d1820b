"""A terminal monitor for snakemake-executor-plugin-context (``snakemake-context monitor``).

Reads a context catalog (SQLite path or SQLAlchemy URL) and shows the fleet by GPU
model, contexts and where they are warm, losses, throughput over time and the current
run's progress. It never writes.
"""

from .app import VIEWS, MonitorApp
from .data import CatalogProblem, CatalogSource, Snapshot

__all__ = ["VIEWS", "CatalogProblem", "CatalogSource", "MonitorApp", "Snapshot", "run"]


def run(catalog: str, interval: float = 1.0) -> None:
    """Run the monitor on a catalog until the user quits."""
    MonitorApp(CatalogSource(catalog), interval=interval).run()
