"""``snakemake-context report``: the GPU ledger of a run (or of a time window, or two
runs side by side) as one HTML file, and its export as CSV and JSON; also what a run
writes itself at its end (``--context-report``)."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import paths
from ..defaults import CONTEXT_DIR
from ..errors import ContextExecutorError
from ..fleet.keys import RUN_ID_FORM, is_run_id
from ..terminal import format_bytes, shown

__all__ = [
    "add_parser",
    "build_report",
    "default_output",
    "parse_since",
    "read_report",
    "report_command",
    "report_name",
    "report_target",
    "since_problem",
    "write_report",
]


def add_parser(commands: Any, catalog_option: Any, catalog_of: Any) -> None:
    """Add the ``report`` command to the command line's subparsers (``catalog_option``
    adds its --catalog option, ``catalog_of`` finds the catalog from the arguments)."""
    sub = commands.add_parser(
        "report",
        help="where every GPU-second of a run went, as one HTML file (and CSV, JSON)",
    )
    from ..settings.checks import TEXT, Allowed, add_argument

    which = sub.add_mutually_exclusive_group()
    which.add_argument("--run", default=None, help="the run's id (default: the latest run)")
    add_argument(
        which,
        "--since",
        Allowed(TEXT, optional=True, form=lambda _flag, text: since_problem(text)),
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


def _since(text: str) -> float | None:
    """Unix seconds, or an ISO 8601 time (local time without a zone); None if neither."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def since_problem(text: str, now: float | None = None) -> str | None:
    """Why ``text`` is no start of a report's window (None: it is one): neither Unix
    seconds nor an ISO 8601 time, not finite, before 1970 or after ``now``."""
    at = _since(text)
    if at is None:
        return "it is neither Unix seconds nor an ISO 8601 time (for example 2026-12-01T07:00)"
    if not math.isfinite(at) or at < 0:
        return "it is no time from 1970 on: give Unix seconds or an ISO 8601 time"
    if at > (time.time() if now is None else now):
        return "it lies in the future: the window runs from it until now"
    return None


def parse_since(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (local time without a zone); refused in one
    line (:func:`since_problem`) otherwise."""
    problem = since_problem(text)
    if problem:
        raise ContextExecutorError(f"--since {text!r} is not allowed: {problem}.")
    at = _since(text)
    assert at is not None  # since_problem said so
    return at


def read_report(
    catalog: str,
    *,
    run: str | None = None,
    since: float | None = None,
    compare: list[str] | None = None,
) -> tuple[Any, Callable[[], str]]:
    """The ledger a report shows (the first one, comparing), read from the catalog,
    and what renders the report's HTML from what was read (the costly part: a caller
    checks where the report goes first)."""
    from ..catalog.reading import reportdata as q
    from ..catalog.reading.ledger import read_ledger, window_of
    from ..catalog.reading.lives import group_lives
    from ..catalog.store import open_reader
    from .page import ReportData, compare_page, report_page

    store = open_reader(catalog)
    try:
        with store.session() as session:
            if compare:
                ledgers = [read_ledger(session, window_of(session, run=r)) for r in compare]
                return ledgers[0], lambda: compare_page(catalog, ledgers)
            window = window_of(session, run=run, since=since)
            ledger = read_ledger(session, window)
            ledger.lives = group_lives(session, window.start, window.end)
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
    return ledger, lambda: report_page(data)


def build_report(
    catalog: str,
    *,
    run: str | None = None,
    since: float | None = None,
    compare: list[str] | None = None,
) -> tuple[str, Any]:
    """The report's HTML, and the ledger it shows (the first one, comparing)."""
    ledger, render = read_report(catalog, run=run, since=since, compare=compare)
    return render(), ledger


def report_name(window: Any, compare: list[str] | None = None) -> str:
    """The default report's name: the run's id, ``RUN-vs-RUN``, or ``since-<time>``.
    A run id becomes part of a path only in its own form (:func:`..fleet.keys.is_run_id`):
    one read from a catalog that another user wrote may be ``/abs/x`` or ``../../x``."""
    runs = list(compare or ([window.run] if window.run else []))
    for run in runs:
        if not is_run_id(run):
            raise ContextExecutorError(
                f"The run id '{shown(run)}' is not of the form of this plugin's run ids "
                f"({RUN_ID_FORM}), so it names no file: the report is not written. "
                "Fix: name the report's file (-o FILE)."
            )
    if runs:
        return "-vs-".join(runs)
    return time.strftime("since-%Y%m%dT%H%M%S", time.localtime(window.start))


def default_output(workdir: Path, name: str) -> Path:
    """Where a report goes by default: ``.snakemake/context/reports/<name>.html``
    (``name`` from :func:`report_name`)."""
    return workdir / CONTEXT_DIR / "reports" / f"{name}.html"


def report_target(output: Path | None, workdir: Path, name: str) -> Path:
    """Where the report goes: ``output``, or (None) its default place in ``workdir``,
    whose directory is made and checked (a real directory of this user's); refused in
    one line when the file cannot be written there (:func:`..paths.output_problem`)."""
    if output is None:
        output = default_output(workdir, name)
        paths.output_directory(output.parent)
    problem = paths.output_problem(output)
    if problem:
        raise ContextExecutorError(f"Cannot write the report {shown(output)}: {problem}.")
    return output


def write_report(page: str, output: Path | None, workdir: Path, name: str) -> Path:
    """Write the report to ``output``, or (None) to its default place in ``workdir``
    (:func:`report_target`); never through a symlink nor over another user's file
    (:func:`..paths.write_output`). Returns the file written."""
    return paths.write_output(report_target(output, workdir, name), page)


def report_command(args: argparse.Namespace, catalog: str) -> int:
    """Write the report (and the exports asked for); print where, and the servers'
    lives per survival group, predicted against actual."""
    from ..catalog.reading.ledger import export_csv, export_json
    from ..catalog.reading.lives import lives_text

    since = parse_since(args.since) if args.since else None
    named = [(args.output, "-o"), (args.csv, "--csv"), (args.json, "--json")]
    for path, flag in named:  # before any work: a bad one refuses the command
        problem = None if path is None else paths.output_problem(path)
        if problem:
            raise ContextExecutorError(f"Cannot write {flag} {shown(path)}: {problem}.")
    ledger, render = read_report(catalog, run=args.run, since=since, compare=args.compare)
    name = report_name(ledger.window, args.compare) if args.output is None else ""
    output = paths.write_output(report_target(args.output, Path.cwd(), name), render())
    print(f"GPU ledger report: {shown(output)} ({format_bytes(output.stat().st_size)})")
    if args.csv:
        print(f"CSV: {shown(paths.write_output(args.csv, export_csv(ledger.rows())))}")
    if args.json:
        print(f"JSON: {shown(paths.write_output(args.json, export_json(ledger)))}")
    for line in lives_text(ledger.lives):
        print(shown(line))
    return 0
