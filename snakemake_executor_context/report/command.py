"""``snakemake-context report``: the GPU ledger of a run (or of a time window, or two
runs side by side) as one HTML file, and its export as CSV and JSON; also what a run
writes itself at its end (``--context-report``)."""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from ..defaults import CONTEXT_DIR
from ..errors import ContextExecutorError

__all__ = ["add_parser", "build_report", "parse_since", "report_command"]


def add_parser(commands: Any, catalog_option: Any, catalog_of: Any) -> None:
    """Add the ``report`` command to the command line's subparsers (``catalog_option``
    adds its --catalog option, ``catalog_of`` finds the catalog from the arguments)."""
    sub = commands.add_parser(
        "report",
        help="where every GPU-second of a run went, as one HTML file (and CSV, JSON)",
    )
    which = sub.add_mutually_exclusive_group()
    which.add_argument("--run", default=None, help="the run's id (default: the latest run)")
    which.add_argument(
        "--since",
        default=None,
        help="a time window from T until now: Unix seconds or ISO 8601 ('2026-12-01T07:00')",
    )
    which.add_argument(
        "--compare", nargs=2, metavar="RUN", default=None, help="two runs' ledgers side by side"
    )
    sub.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="the HTML file (default: .snakemake/context/reports/<run>.html)",
    )
    sub.add_argument("--csv", type=Path, default=None, help="also export the ledger as CSV here")
    sub.add_argument("--json", type=Path, default=None, help="also export the ledger as JSON here")
    catalog_option(sub)
    sub.set_defaults(func=lambda args: report_command(args, catalog_of(args)))


def parse_since(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (local time without a zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ContextExecutorError(
            f"--since {text!r} is neither Unix seconds nor an ISO 8601 time "
            "(for example 2026-12-01T07:00)."
        ) from None


def build_report(
    catalog: str,
    *,
    run: str | None = None,
    since: float | None = None,
    compare: list[str] | None = None,
) -> tuple[str, Any]:
    """The report's HTML, and the ledger it shows (the first one, comparing)."""
    from ..catalog import report_queries as q
    from ..catalog.ledger import read_ledger, window_of
    from ..catalog.store import open_reader
    from .page import ReportData, compare_page, report_page

    store = open_reader(catalog)
    try:
        with store.session() as session:
            if compare:
                ledgers = [read_ledger(session, window_of(session, run=r)) for r in compare]
                return compare_page(catalog, ledgers), ledgers[0]
            window = window_of(session, run=run, since=since)
            ledger = read_ledger(session, window)
            runs = q.run_summaries(session, window)
            data = ReportData(
                catalog=catalog,
                ledger=ledger,
                runs=runs,
                throughput=q.throughput(session, window),
                fleet=q.fleet_size(session, window),
                batches=q.batch_histogram(session, window),
                placements=q.placements(session, window),
                pool=q.pool_books(session, window),
            )
    finally:
        store.close()
    if not ledger.servers:
        data.notices.append("No server was alive in this window: there is nothing to account.")
    ran = any(r.jobs_ok or r.jobs_failed for r in runs) or data.placements
    if window.run is not None and not ran:
        data.notices.append(
            f"Run {window.run} ran no job: its servers' time is all starting, loading or idle."
        )
    return report_page(data), ledger


def default_output(workdir: Path, name: str) -> Path:
    """Where a report goes by default: ``.snakemake/context/reports/<name>.html``."""
    return workdir / CONTEXT_DIR / "reports" / f"{name}.html"


def report_command(args: argparse.Namespace, catalog: str) -> int:
    """Write the report (and the exports asked for); print where, and its headline."""
    from ..catalog.ledger import export_csv, export_json

    since = parse_since(args.since) if args.since else None
    page, ledger = build_report(catalog, run=args.run, since=since, compare=args.compare)
    window = ledger.window
    name = (
        "-vs-".join(args.compare)
        if args.compare
        else window.run or time.strftime("since-%Y%m%dT%H%M%S", time.localtime(window.start))
    )
    output = args.output or default_output(Path.cwd(), name)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page)
    print(f"GPU ledger report: {output} ({output.stat().st_size / 1e6:.1f} MB)")
    if args.csv:
        args.csv.write_text(export_csv(ledger.rows()))
        print(f"CSV: {args.csv}")
    if args.json:
        args.json.write_text(export_json(ledger))
        print(f"JSON: {args.json}")
    return 0
