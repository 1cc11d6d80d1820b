"""Benchmark of the ledger and its report at scale: 1,000 servers and 100,000 jobs.

Builds the monitor benchmark's catalog (``workflows/bench/monitor.py``: five GPU
models, 20 contexts, 100,000 finished jobs, here of 10 ms each, 25 servers lost with
a job each) and
prints, beside the machine's calibration: the ledger query (every server's account
over the run), the report's build time and size (`snakemake-context report`'s own
code), the CSV export, and the monitor's live ledger: its first read and a poll after
100 jobs finished on 100 servers.

    python workflows/bench/ledger.py [--servers 1000] [--jobs 100000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from monitor import build, calibrate
from snakemake_executor_context.catalog.reading.ledger import export_csv, read_ledger, window_of
from snakemake_executor_context.catalog.reading.liveledger import LiveLedger
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.fleet import events
from snakemake_executor_context.report.reportcommand import build_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    calibration = calibrate()
    print(f"machine: {os.cpu_count()} CPUs, load {load:.2f}; calibration {calibration}")
    path = Path(tempfile.mkdtemp(prefix="bench-ledger-")) / "catalog.db"
    # Jobs of 10 ms, one every 30 ms across the fleet: on each server, 100 jobs with
    # idle gaps between them (some 200,000 segments to account and draw).
    builder, fleet, contexts, run = build(path, args.servers, args.jobs, job_seconds=0.01)
    builder.emit(events.RunFinished(at=builder.now, run_id=run, ok=True))
    builder.commit()
    result: dict[str, float] = {"load_average": load, **calibration}
    store = open_reader(path)
    with store.session() as session:
        started = time.perf_counter()
        ledger = read_ledger(session, window_of(session))
        result["ledger_query_s"] = time.perf_counter() - started
        started = time.perf_counter()
        text = export_csv(ledger.rows())
        result["csv_s"] = time.perf_counter() - started
        result["csv_mb"] = len(text) / 1e6
        live = LiveLedger()
        started = time.perf_counter()
        live.read(session, time.time())
        result["live_first_read_s"] = time.perf_counter() - started
    segments = sum(len(s.segments) for s in ledger.servers)
    started = time.perf_counter()
    page, _ = build_report(str(path))
    result["report_s"] = time.perf_counter() - started
    result["report_mb"] = len(page.encode()) / 1e6
    builder.now = time.time()
    for turn in range(100):
        builder.job(run, "score", server=fleet[turn], context=contexts[turn % 20], seconds=0.01)
    builder.commit()
    with store.session() as session:
        started = time.perf_counter()
        live.read(session, time.time())
        result["live_poll_100_jobs_ms"] = 1000 * (time.perf_counter() - started)
        started = time.perf_counter()
        live.read(session, time.time())
        result["live_poll_unchanged_ms"] = 1000 * (time.perf_counter() - started)
    store.close()
    builder.close()
    print(f"catalog: {args.servers} servers, {args.jobs} jobs, {path.stat().st_size / 1e6:.0f} MB")
    print(
        f"ledger query (every server's account over the run): {result['ledger_query_s']:.2f} s "
        f"({segments} segments); target <= 2 s"
    )
    print(
        f"report: built in {result['report_s']:.1f} s, {result['report_mb']:.1f} MB; "
        "target <= 20 s, <= 10 MB"
    )
    print(f"CSV export: {result['csv_s']:.2f} s, {result['csv_mb']:.1f} MB")
    print(
        f"monitor's live ledger: first read {result['live_first_read_s']:.2f} s; a poll after "
        f"100 jobs on 100 servers {result['live_poll_100_jobs_ms']:.0f} ms; a poll with "
        f"nothing new {result['live_poll_unchanged_ms']:.1f} ms"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ledger.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
