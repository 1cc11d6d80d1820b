"""Benchmark of the monitor at scale: 1,000 servers and 100,000 recorded jobs.

Prints (and writes as JSON with --out), beside a calibration of the machine (a fixed
pure-Python loop and a fixed SQLite query, so runs on other machines compare):
- the time to build the catalog (the catalog's own builder, jobs in bulk);
- the refresh query (one poll: what changed since the last, and every view's data)
  p50/p95/max, while the app polls every 250 ms and a writer process records 100
  finished jobs (through the builder and the catalog's recorder, one transaction) after
  every other poll;
- the time a poll's result takes on the UI thread, separately for polls in which
  nothing changed and polls after 100 jobs finished;
- key press to rendered frame over view switches during those polls (p50, p95, worst).

    python workflows/bench/monitor.py [--servers 1000] [--jobs 100000] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from snakemake_context_monitor import CatalogSource, MonitorApp

from snakemake_executor_context.fleet import events

# The catalog builder is test support (tests/catalog_builder.py), not shipped.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.catalog_builder import CatalogBuilder

MODELS = [
    "NVIDIA H200",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB",
    "Tesla V100-SXM2-16GB",
    "NVIDIA L40S",
]
#: Jobs the writer records at once between two polls.
BATCH = 100


def calibrate() -> dict[str, float]:
    """Milliseconds, best of five: a fixed pure-Python loop, and a fixed SQLite query
    (a grouped aggregate over 100,000 rows in memory)."""

    def python_loop() -> int:
        total = 0
        for i in range(1_000_000):
            total += i * i % 7
        return total

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a INTEGER, b REAL)")
    db.executemany("INSERT INTO t VALUES (?, ?)", ((i % 1000, i * 0.5) for i in range(100_000)))

    def sqlite_query() -> int:
        return len(db.execute("SELECT a, count(*), sum(b) FROM t GROUP BY a").fetchall())

    def best(function: Any) -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            function()
            times.append(time.perf_counter() - started)
        return 1000 * min(times)

    return {"python_loop_ms": best(python_loop), "sqlite_query_ms": best(sqlite_query)}


def build(
    path: Path, servers: int, jobs: int, job_seconds: float = 0.0
) -> tuple[CatalogBuilder, list[str], list[str], str]:
    """A catalog like a long run on a big heterogeneous fleet, by the catalog's own
    builder (finished jobs in bulk, each ``job_seconds`` long); the builder is returned
    open, for the writer."""
    b = CatalogBuilder(path, start=time.time() - jobs * 0.02 - 600)
    fleet = [b.server(f"gpu{i}", gpu=MODELS[i % len(MODELS)]) for i in range(servers)]
    contexts = [b.context(f"model{i}", arguments={"i": i}) for i in range(20)]
    run = b.run("big", jobs_total=jobs + 500)
    for index, server in enumerate(fleet):
        b.load(server, contexts[index % 20], seconds=0.01)
    for start in range(0, jobs, 2000):
        indexes = range(start, min(jobs, start + 2000))
        places = [(fleet[i % servers], contexts[i % servers % 20]) for i in indexes]
        b.jobs(run, "score", places, gap=0.02, seconds=job_seconds, items=32)
        b.emit(events.RunHeartbeat(at=b.now, run_id=run))
    for lost in fleet[:25]:
        b.start_job(run, "score", server=lost, context=contexts[0])
        b.lose_server(lost)
    b.emit(events.RunHeartbeat(at=b.now, run_id=run))
    b.commit()
    return b, fleet[25:], contexts, run


def writer(b: CatalogBuilder, fleet: list[str], contexts: list[str], run: str, pipe: Any) -> None:
    """In a process of its own: on each request, 100 jobs finish on 100 servers, recorded
    one by one by the catalog's recorder and committed in one transaction."""
    b.store.engine.dispose(close=False)  # the parent's connections stay the parent's
    turn = 0
    while pipe.recv():
        b.now = time.time()
        for _ in range(BATCH):
            server = fleet[turn % len(fleet)]
            context = contexts[(turn + 25) % len(fleet) % 20]
            b.job(run, "score", server=server, context=context, seconds=0.001, items=32)
            turn += 1
        b.emit(events.RunHeartbeat(at=b.now, run_id=run))
        b.commit()
        pipe.send(True)
    b.store.engine.dispose()


class TimedApp(MonitorApp):
    """The monitor, noting when the frame after each view switch is rendered."""

    rendered: list[float]

    def action_show(self, tab: str) -> None:
        super().action_show(tab)
        self.call_after_refresh(lambda: self.rendered.append(time.perf_counter()))


async def polling(path: Path, presses: int, pipe: Connection) -> dict[str, Any]:
    """Switch views while the app polls every 250 ms and the writer adds 100 finished
    jobs after every other poll."""
    app = TimedApp(CatalogSource(path), interval=0.25)
    app.rendered = []
    latencies: list[float] = []

    async def feed() -> None:
        """Ask for a batch once the poll after the previous one has been applied."""
        seen = 0
        while True:
            while app.polls < seen + 2:
                await asyncio.sleep(0.01)
            seen = app.polls
            pipe.send(True)
            while not pipe.poll():
                await asyncio.sleep(0.01)
            pipe.recv()

    async with app.run_test(size=(120, 36)) as pilot:
        while app.polls < 3:
            await asyncio.sleep(0.05)
        first = len(app.applied)
        feeding = asyncio.create_task(feed())
        keys = "fcltgp"
        for index in range(presses):
            before = len(app.rendered)
            started = time.perf_counter()
            await pilot.press(keys[index % len(keys)])
            while len(app.rendered) == before:
                await asyncio.sleep(0.001)
            latencies.append(app.rendered[-1] - started)
            await asyncio.sleep(0.11)  # presses land at every phase of the polls
        feeding.cancel()
        applied = app.applied[first:]
    return {"latencies": latencies, "applied": applied}


def stats(values: list[float], worst: str = "max") -> dict[str, float]:
    """p50, p95 and the worst, in milliseconds."""
    if not values:
        return {"n": 0, "p50": float("nan"), "p95": float("nan"), worst: float("nan")}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "p50": 1000 * statistics.median(values),
        "p95": 1000 * p95,
        worst: 1000 * ordered[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--presses", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    calibration = calibrate()
    load = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} CPUs, load {load:.2f}; Python "
        f"{sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}"
    )
    print(
        f"calibration (best of 5): pure-Python loop of 1,000,000 steps "
        f"{calibration['python_loop_ms']:.0f} ms; SQLite grouped query over 100,000 rows "
        f"{calibration['sqlite_query_ms']:.1f} ms",
        flush=True,
    )
    path = Path(tempfile.mkdtemp(prefix="bench-monitor-")) / "catalog.db"
    print(f"building a catalog of {args.servers} servers and {args.jobs} jobs ...", flush=True)
    started = time.perf_counter()
    builder, fleet, contexts, run = build(path, args.servers, args.jobs)
    build_seconds = time.perf_counter() - started
    print(f"catalog: {path.stat().st_size / 1e6:.0f} MB, built in {build_seconds:.1f} s")

    source = CatalogSource(path)
    started = time.perf_counter()
    source.fetch("15 min")
    first_read = time.perf_counter() - started
    source.close()

    parent, child = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(
        target=writer, args=(builder, fleet, contexts, run, child), daemon=True
    )
    process.start()
    try:
        measured = asyncio.run(polling(path, args.presses, parent))
    finally:
        parent.send(False)
        process.join(30)
        builder.close()
    applied = measured["applied"]
    quiet = [a.seconds for a in applied if a.changed == 0]
    batches = [a.seconds for a in applied if a.finished == BATCH]
    result = {
        "servers": args.servers,
        "jobs": args.jobs,
        "load_average": load,
        "calibration": calibration,
        "catalog_mb": path.stat().st_size / 1e6,
        "build_seconds": build_seconds,
        "first_read_ms": 1000 * first_read,
        "refresh_ms": stats([a.read_seconds for a in applied]),
        "apply_unchanged_ms": stats(quiet),
        "apply_100_finished_ms": stats(batches),
        "key_to_render_ms": stats(measured["latencies"], "worst"),
        "polls": len(applied),
    }
    print(
        f"first read (everything, from scratch): {result['first_read_ms']:.0f} ms; then "
        f"{len(applied)} polls while switching views {args.presses} times"
    )
    print(f"{'measure':<52}{'n':>5}{'p50':>8}{'p95':>8}{'worst':>8}   target")
    for label, key, target in (
        ("refresh query (one poll), ms", "refresh_ms", "p95 <= 150"),
        ("UI thread per poll, nothing changed, ms", "apply_unchanged_ms", "p95 <= 10"),
        ("UI thread per poll, 100 jobs finished, ms", "apply_100_finished_ms", "p95 <= 30"),
        ("key press to render, during polls, ms", "key_to_render_ms", "worst <= 100"),
    ):
        row = result[key]
        worst = row.get("max", row.get("worst"))
        print(
            f"{label:<52}{row['n']:>5}{row['p50']:>8.1f}{row['p95']:>8.1f}{worst:>8.1f}   {target}"
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "monitor.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
