"""Benchmark of the catalog and of placement (numbers for docs/catalog.md).

1. Catalog size and cost: write N jobs over S servers and C contexts through the real
   writer thread into a SQLite catalog, each job's events as a run sends them
   (dispatched with its outputs, started, finished, the executor's own copy of the end
   for one job in ten, reported, and --stories story lines); report MB per 10,000
   jobs (target: <= 20 MB), the writer's events/s, and the writer thread's CPU ms per
   job (its own clock: the feeding thread is not counted).
2. Placement: a fleet view of S servers of several GPU models that has taken in the
   same N jobs' events (plus loads), then D decisions of ``choose_server`` for jobs of
   random contexts while about 70% of the slots are busy, each weighing the demand of
   a DAG of N jobs still to come (read from :class:`Demand`, one job ending per
   decision); report median and p99 (targets: <= 0.2 ms median, <= 5 ms p99 with
   1,000 servers and 100,000 jobs).
3. Reading: the seed query a run makes at start, and ``status``'s overview, on that
   catalog.

    python workflows/bench/catalog.py [--servers 1000] [--jobs 100000] [--decisions 20000]
        [--stories 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from snakemake_executor_context.catalog.reading import status as queries
from snakemake_executor_context.catalog.store import open_reader, open_store
from snakemake_executor_context.catalog.writing.writer import CatalogWriter
from snakemake_executor_context.dispatch.inflight import Demand
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.placement import choose_server
from snakemake_executor_context.fleet.resources import Requirements, job_resources
from snakemake_executor_context.fleet.state import FleetState

MODELS = ["h200", "h100-80gb-hbm3", "a100-sxm4-80gb", "l40s", "a100-sxm4-40gb-mig-3g.20gb"]
NAMES = {
    "h200": "NVIDIA H200",
    "h100-80gb-hbm3": "NVIDIA H100 80GB HBM3",
    "a100-sxm4-80gb": "NVIDIA A100-SXM4-80GB",
    "l40s": "NVIDIA L40S",
    "a100-sxm4-40gb-mig-3g.20gb": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
}


def fleet_events(servers: int, contexts: list[str], rng: random.Random) -> list[ev.Event]:
    """Servers joining and describing themselves, each with 1-2 contexts loaded."""
    out: list[ev.Event] = []
    for i in range(servers):
        model = MODELS[i % len(MODELS)]
        address = f"tcp://10.{i // 250}.{i % 250}.1:4000"
        resources = {"gpu": 1, "mem_mb": 256000, f"gpu_model:{model}": 1}
        for token in model.split("-"):
            resources[f"gpu_model:{token}"] = 1
        out.append(ev.ServerJoined(address=address, name=f"gpu{i}", slots=1, resources=resources))
        out.append(
            ev.ServerDescribed(
                address=address,
                name=f"gpu{i}",
                memory_budget=60_000_000_000,
                gpu={"name": NAMES[model], "uuid": f"GPU-{i:08x}", "index": 0},
            )
        )
        for identity in rng.sample(contexts, rng.choice((1, 2))):
            out.append(
                ev.ContextReady(
                    address=address,
                    identity=identity,
                    load_seconds=rng.uniform(5, 40),
                    bytes=20_000_000_000,
                    gpu_model=model,
                )
            )
    return out


def job_events(
    run_id: str, i: int, address: str, identity: str, model: str, at: float, stories: int
) -> list[ev.Event]:
    """One job's events, as dispatch (:mod:`~snakemake_executor_context.dispatch`) and
    its server send them."""
    key = f"score-{i}-a1-{i:08x}"
    seconds = 2.0 + (i % 7) * 0.1
    outputs = [f"results/score/{i}.parquet", f"results/score/{i}.json"]
    finished = ev.JobFinished(
        at=at + seconds,
        run_id=run_id,
        key=key,
        address=address,
        context=identity,
        started=at,
        finished=at + seconds,
        items=32,
        gpu_model=model,
        batches={"32": 1},
    )
    events: list[ev.Event] = [
        ev.JobDispatched(
            at=at,
            run_id=run_id,
            key=key,
            jobid=str(i),
            rule="score",
            wildcards={"shard": str(i)},
            context=identity,
            context_name=identity[:8],
            target=address,
            submitted=at,
            reason="warm",
            log=f"logs/score/{i}.log",
            stimulus="job-ready",
            outputs=outputs,
        ),
        ev.JobStarted(at=at, run_id=run_id, key=key, address=address, context=identity),
        finished,
    ]
    if i % 10 == 0:  # the executor's record of the end, from the result
        events.append(finished)
    events += [
        ev.JobStory(
            at=at + seconds,
            run_id=run_id,
            key=key,
            jobid=str(i),
            rule="score",
            what="ended",
            detail=f"ok on {address}",
            stimulus="attempt-ended",
        )
        for _ in range(stories)
    ]
    events.append(
        ev.JobReported(
            at=at + seconds,
            run_id=run_id,
            key=key,
            jobid=str(i),
            rule="score",
            stimulus="attempt-ended",
            outputs=outputs,
        )
    )
    return events


def thread_cpu(thread: threading.Thread) -> float:
    """Seconds of CPU ``thread`` has used (its own clock)."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def size_mb(path: Path) -> float:
    total = sum(
        Path(f"{path}{suffix}").stat().st_size
        for suffix in ("", "-wal")
        if Path(f"{path}{suffix}").exists()
    )
    return total / 1e6


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--contexts", type=int, default=20)
    parser.add_argument("--stories", type=int, default=2, help="story lines a job")
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument(
        "--dag", type=int, default=None, help="jobs still to come in the run's DAG (default --jobs)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write catalog.json here")
    args = parser.parse_args()
    rng = random.Random(42)
    contexts = [f"{i:064x}" for i in range(args.contexts)]
    workdir = Path(tempfile.mkdtemp(prefix="bench-catalog-"))
    path = workdir / "catalog.db"
    results: dict[str, float | int] = {
        "servers": args.servers,
        "jobs": args.jobs,
        "dag": args.dag or args.jobs,
        "cpu_count": os.cpu_count() or 0,
    }

    # 1. Write the fleet and the jobs through the writer thread.
    warnings: list[str] = []
    writer = CatalogWriter(open_store(path), warn=warnings.append)
    view = FleetState()
    fleet = fleet_events(args.servers, contexts, rng)
    writer.submit(ev.RunStarted(run_id="bench", workdir=str(workdir), jobs_total=args.jobs))
    for item in fleet:
        writer.submit(item)
        view.apply(item)
    addresses = list(view.servers)
    writer.flush(600)
    writer_cpu = thread_cpu(writer._thread)
    started = time.perf_counter()
    now, sent, size_at_10k = time.time(), 0, None
    for i in range(args.jobs):
        address = addresses[i % len(addresses)]
        server = view.servers[address]
        identity = next(iter(server.contexts))
        at = now + i * 0.01
        for item in job_events("bench", i, address, identity, server.gpu_model, at, args.stories):
            while not writer.submit(item):  # a full queue drops; the benchmark waits
                time.sleep(0.01)
            view.apply(item)
            sent += 1
        if i + 1 == 10_000:
            writer.flush(600)
            size_at_10k = size_mb(path)
    writer.submit(ev.RunFinished(run_id="bench", ok=True))
    fed = time.perf_counter()
    writer.flush(3600)
    write_seconds = time.perf_counter() - started
    results["writer_cpu_ms_per_job"] = round(
        1000 * (thread_cpu(writer._thread) - writer_cpu) / args.jobs, 3
    )
    results["writer_catch_up_s"] = round(time.perf_counter() - fed, 2)
    writer.close()
    # The benchmark outruns the queue on purpose (and waits): only real errors count.
    assert not [w for w in warnings if "is full" not in w], warnings
    total_mb = size_mb(path)
    results["catalog_mb"] = round(total_mb, 2)
    results["catalog_mb_per_10k_jobs"] = round(total_mb / args.jobs * 10_000, 2)
    if size_at_10k is not None:
        results["catalog_mb_first_10k_jobs"] = round(size_at_10k, 2)
    results["writer_events_per_s"] = round(sent / write_seconds)

    # 2. Placement decisions over the view.
    wanted = [
        job_resources(Requirements(gpu=1)),
        job_resources(Requirements(gpu=1, gpu_model="h200")),
        job_resources(Requirements(gpu=1, gpu_model="a100")),
    ]
    busy: list[str] = []
    for index, address in enumerate(addresses):
        if rng.random() < 0.7:
            key = f"busy-{index}"
            view.dispatched(key, address, None, now)
            busy.append(key)
    # The run's DAG: args.jobs jobs still to come, spread over the contexts; every
    # decision reads the demand and a job ends (kept incrementally, never walked).
    demand = Demand()
    dag = args.dag or args.jobs
    demand.plan({str(i): contexts[i % len(contexts)] for i in range(dag)})
    ending = iter(range(dag))
    timings: list[float] = []
    placed = 0
    for n in range(args.decisions):
        identity = rng.choice(contexts)
        resources = wanted[n % len(wanted)]
        begin = time.perf_counter()
        counts = demand.counts(())
        decision = choose_server(
            view, resources, identity, remaining=counts[identity], demand=counts, now=now
        )
        timings.append(time.perf_counter() - begin)
        finished = next(ending, None)
        if finished is not None:
            demand.ended(contexts[finished % len(contexts)], str(finished))
        if decision.address is not None:
            placed += 1
            key = f"d-{n}"
            view.dispatched(key, decision.address, identity, now)
            busy.append(key)
        if busy and rng.random() < 0.9:  # a job ends somewhere: keep ~70% busy
            done = busy.pop(rng.randrange(len(busy)))
            view.release(done)
    results["decision_median_ms"] = round(1000 * statistics.median(timings), 4)
    results["decision_p99_ms"] = round(1000 * percentile(timings, 0.99), 4)
    results["decision_max_ms"] = round(1000 * max(timings), 3)
    results["decisions_placed"] = placed

    # 3. Reading it back.
    reader = open_reader(path)
    with reader.session() as session:
        begin = time.perf_counter()
        queries.placement_measurements(session)
        results["seed_query_ms"] = round(1000 * (time.perf_counter() - begin), 1)
        begin = time.perf_counter()
        queries.overview(session)
        results["status_overview_ms"] = round(1000 * (time.perf_counter() - begin), 1)
    reader.close()

    print()
    print(f"{'measure':<52}{'value':>12}  target")
    print(f"{'catalog MB per 10,000 jobs':<52}{results['catalog_mb_per_10k_jobs']:>12}  <= 20")
    print(f"{'catalog MB in all (' + str(args.jobs) + ' jobs)':<52}{results['catalog_mb']:>12}")
    per_job = f"{sent / args.jobs:.1f} events a job"
    print(f"{'writer events/s (' + per_job + ')':<52}{results['writer_events_per_s']:>12}")
    print(f"{'writer thread CPU ms per job':<52}{results['writer_cpu_ms_per_job']:>12}")
    print(f"{'writer catching up after the last event, s':<52}{results['writer_catch_up_s']:>12}")
    label = f"placement decision median ms ({args.servers} servers)"
    print(f"{label:<52}{results['decision_median_ms']:>12}  <= 0.2")
    print(f"{'placement decision p99 ms':<52}{results['decision_p99_ms']:>12}  <= 5")
    print(f"{'seed query at run start ms':<52}{results['seed_query_ms']:>12}")
    print(f"{'status overview ms':<52}{results['status_overview_ms']:>12}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "catalog.json").write_text(json.dumps(results, indent=1))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    workdir.rmdir()


if __name__ == "__main__":
    main()
