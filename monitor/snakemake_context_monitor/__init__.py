"""A terminal monitor for snakemake-executor-plugin-context (``snakemake-context monitor``).

Reads a context catalog (SQLite path or SQLAlchemy URL) and shows the fleet by GPU
model, contexts and where they are warm, losses, throughput over time and the current
run's progress. It never writes.

- :mod:`.app`: the Textual app, its views declared once, polling off the UI thread;
- :mod:`.data`: one poll of the catalog; :mod:`.derive`: what the views show, derived
  in memory; :mod:`.rows`: those rows as plain data; :mod:`.model`: view models and
  what changed since the last poll;
- :mod:`.tables`: keyed updates of the views' tables; :mod:`.format`: numbers and
  times; :mod:`.statusbar`: the top line;
- :mod:`.views`: one view (a widget) per module.
"""

from .app import VIEWS, MonitorApp
from .data import CatalogProblem, CatalogSource, Snapshot

__all__ = ["VIEWS", "CatalogProblem", "CatalogSource", "MonitorApp", "Snapshot", "run"]


def run(catalog: str, interval: float = 1.0) -> None:
    """Run the monitor on a catalog until the user quits."""
    MonitorApp(CatalogSource(catalog), interval=interval).run()
