"""Does a catalog slow down as it fills? Runs of N jobs (4 events each, as a run and
its servers send them) are written one after another through the real writer into one
catalog (SQLite, or a PostgreSQL URL); for the first run and every ``--every``-th one
it prints the writer's events/s, and the time of what readers do on the catalog as it
then is: ``status``'s overview, a new monitor's first read, and the run's ledger report.

    python workflows/bench/catalog_history.py [--runs 100] [--jobs 2000] [--every 25] \\
        [--catalog PATH|URL]

Numbers for docs/catalog.md; JSON lines with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from catalog import job_events  # type: ignore[import-not-found]

from snakemake_executor_context.catalog.reading import status as queries
from snakemake_executor_context.catalog.reading.monitoring import MonitorReader
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.catalog.writing.writer import open_writer
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.report.reportcommand import build_report

SERVERS = ("tcp://127.0.0.1:4001", "tcp://127.0.0.1:4002")
IDENTITY = "noop-" + "0" * 59


def write_run(catalog: str, number: int, jobs: int) -> tuple[str, float]:
    """Write one run of ``jobs`` jobs (its writer opened and closed, as a run's is);
    returns its id and the writer's events per second."""
    run_id = f"history-{number:04d}"
    at = time.time()
    events: list[ev.Event] = [ev.RunStarted(at=at, run_id=run_id, workdir="/w", jobs_total=jobs)]
    if number == 0:
        for address in SERVERS:
            events.append(ev.ServerJoined(at=at, address=address, name=address[-4:], slots=1))
    for i in range(jobs):
        address = SERVERS[i % len(SERVERS)]
        events += job_events(run_id, i, address, IDENTITY, "cpu", at + i * 0.01)
    events.append(ev.RunFinished(at=at + jobs * 0.01, run_id=run_id, ok=True))
    writer = open_writer(catalog, owner=f"run {run_id}", warn=print, say=print)
    started = time.monotonic()
    for event in events:
        while not writer.submit(event):  # the queue is full: let the writer catch up
            time.sleep(0.01)
    writer.close(timeout=60.0, patience=600.0)
    took = time.monotonic() - started
    if writer.dropped:
        raise SystemExit(f"run {number}: {writer.dropped} event(s) not written")
    return run_id, len(events) / took


def reads(catalog: str, run_id: str) -> dict[str, float]:
    """Seconds of what readers do: the overview, a monitor's first read, a report."""
    store = open_reader(catalog)
    try:
        started = time.monotonic()
        with store.session() as session:
            queries.overview(session)
        overview = time.monotonic() - started
        started = time.monotonic()
        with store.session() as session:
            MonitorReader().read(session, now=time.time())
        monitor = time.monotonic() - started
    finally:
        store.close()
    started = time.monotonic()
    build_report(catalog, run=run_id)
    report = time.monotonic() - started
    return {"overview_s": overview, "monitor_first_read_s": monitor, "report_s": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--catalog", default=None, help="a path or URL (default: a new file)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    catalog = args.catalog or str(Path(tempfile.mkdtemp()) / "catalog.db")
    rows = []
    for number in range(args.runs):
        run_id, rate = write_run(catalog, number, args.jobs)
        if number == 0 or (number + 1) % args.every == 0:
            row = {"runs": number + 1, "events_per_s": rate, **reads(catalog, run_id)}
            rows.append(row)
            print(
                f"after {number + 1:>4} runs of {args.jobs} jobs: writer {rate:7.0f} events/s, "
                f"overview {row['overview_s']:.2f} s, monitor's first read "
                f"{row['monitor_first_read_s']:.2f} s, report {row['report_s']:.2f} s",
                flush=True,
            )
    if args.out:
        args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
