"""The simulator's numbers (docs/simulator.md): replays of measured runs, the paper's
RQ1-RQ4 at their size, and the dispatch machine's CPU time at scale.

    python workflows/bench/simulate.py replay CATALOG [--snakefile S] [--label L]
    python workflows/bench/simulate.py paper [--out DIR] [--quick]
    python workflows/bench/simulate.py control --servers 186 --jobs 100000 [--queue 1]
    python workflows/bench/simulate.py rq4-wall

``replay`` simulates a catalog's run with its own times and prints predicted against
measured (makespan, jobs per server). ``paper`` fits the three unknowns to RQ1 and
predicts RQ2-RQ4 beside the paper's numbers, with the sensitivity to the assumptions
(``--quick`` skips the 145,449-job batch-1 runs and the refits). ``control`` runs
``--jobs`` one-item jobs on ``--servers`` servers and reports the real dispatch
machine's CPU seconds per job (Snakemake's --jobs is ``--queue`` times the servers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import paper
import yaml

from snakemake_executor_context.fleet.loads import LoadKind
from snakemake_executor_context.simulate.engine import Simulation
from snakemake_executor_context.simulate.model import (
    Fleet,
    JobTimes,
    Options,
    PoolSpec,
    ServerKind,
)
from snakemake_executor_context.simulate.replay import Replay, replay
from snakemake_executor_context.simulate.result import describe
from snakemake_executor_context.simulate.simdefaults import LOADS_PER_SOURCE, PEER_TRANSFERS
from snakemake_executor_context.simulate.workload import from_spec


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def do_replay(args: argparse.Namespace) -> None:
    config = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.config)}
    kwargs = {
        "snakefile": args.snakefile,
        "workdir": args.snakefile.parent if args.snakefile else None,
        "config": config or None,
    }
    result = replay(args.catalog, **kwargs)
    print(f"[{args.label}] load average {_load()}")
    print(result.describe())
    print(
        f"  makespan error {100 * result.makespan_error:+.1f}%, worst server "
        f"{100 * result.worst_server_error():.1f}%; loads measured "
        f"{dict(Counter(load.kind.value for load in result.measured.loads))}, predicted "
        f"{result.predicted.loads}; losses measured {len(result.measured.losses)}, "
        f"predicted {result.predicted.losses}"
    )
    if args.pool is not None:
        pooled = replay(args.catalog, fleet=_pool_of(result, args.pool), **kwargs)
        print("the same run, its pool simulated (the real pool policy, the measured waits):")
        print(pooled.describe())
        print(f"  worst server {100 * pooled.worst_server_error():.1f}%")
        began = result.measured.started
        joins = sorted(round(s.joined - began, 1) for s in result.measured.servers)
        predicted = [round(at, 1) for at, what, _ in pooled.predicted.events if what == "joined"]
        print(f"  pilots joined (s from the run's start): measured {joins}; predicted {predicted}")


def _pool_of(result: Replay, books_path: Path) -> Fleet:
    """A pool of the run's kinds of pilot, its waits as its books measured them."""
    books = json.loads(books_path.read_text())["rq4"]
    rows = books["rows"]
    waits = [row["sbatch_to_registration"] for row in rows]
    measured = result.measured
    ready = sum(1 for s in measured.servers if s.joined <= measured.started)
    models = sorted({s.gpu_model for s in measured.servers})
    kinds = [ServerKind(model, len(rows)) for model in models]
    spec = PoolSpec(
        minimum=ready,
        maximum=len(rows),
        queue_wait=statistics.median(waits),
        queue_draw="fixed",
        startup=0.0,
        idle_timeout=20.0,
        ready=ready,
    )
    return Fleet(kinds, pool=spec)


def _row(name: str, paper_value: float | str, ours: float | str, note: str = "") -> str:
    def fmt(value: float | str) -> str:
        return f"{value:,.0f}" if isinstance(value, (int, float)) else value

    return f"| {name} | {fmt(paper_value)} | {fmt(ours)} | {note} |"


def do_paper(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    print(f"load average {_load()}")
    fitted = paper.fit()
    print(f"fitted: {fitted}  [{time.perf_counter() - began:.0f} s]")
    rq1 = paper.rq1(fitted)
    rq2 = paper.rq2(fitted, partial_batch1=not args.quick)
    rq3 = paper.rq3(fitted)
    rq4 = paper.rq4(fitted)
    out: dict[str, object] = {
        "params": asdict(fitted),
        "rq1": rq1,
        "rq2": rq2,
        "rq3": rq3,
        "rq4": rq4,
    }
    print(json.dumps(out, indent=1, default=str))
    p = paper.PAPER
    ratio = rq3["full"] / max(1.0, rq3["partial"])
    full = rq2["full"]
    assert isinstance(full, dict)
    small = rq4["small"]
    assert isinstance(small, dict)
    pools = {name: float(rq4[name]) for name, _, _ in paper.RQ4_POOLS}  # type: ignore[arg-type]
    lines = [
        "| measure | paper | simulated | note |",
        "|---|---|---|---|",
        _row("RQ1 context-agnostic, s", p["rq1_agnostic"], rq1["agnostic"], "fitted"),
        _row("RQ1 partial-context, s", p["rq1_partial"], rq1["partial"], "fitted"),
        _row("RQ1 full-context, s", p["rq1_full"], rq1["full"], "fitted"),
        _row(
            "RQ2 full-context spread over claims per task",
            "13.6%",
            f"{100 * float(rq2['full_spread']):.1f}%",  # type: ignore[arg-type]
            ", ".join(f"{b}: {s:,.0f} s" for b, s in full.items()),
        ),
        _row(
            "RQ2 partial-context at 1 claim per task, s",
            p["rq2_partial_batch1"],
            rq2.get("partial_batch1", "not run"),  # type: ignore[arg-type]
        ),
        _row("RQ3 partial-context, inferences", p["rq3_partial"], rq3["partial"]),
        _row("RQ3 full-context, inferences", p["rq3_full"], rq3["full"], f"{ratio - 1:+.1%}"),
        _row("RQ3 full-context with peer transfer", "", rq3["full_peer"]),
        _row(
            "RQ4 4-20 GPUs, s",
            "within 5,000",
            f"{min(small.values()):,.0f}-{max(small.values()):,.0f}",
            ", ".join(f"{n}: {s:,.0f}" for n, s in small.items()),
        ),
        _row(
            "RQ4 186 GPUs, the plugin's defaults, s",
            p["rq4_186"],
            pools["pool_defaults"],
            _defaults(),
        ),
        _row(
            "RQ4 186 GPUs, the default limit, no peer transfer, s",
            p["rq4_186"],
            pools["pool_limit_no_peer"],
            f"{LOADS_PER_SOURCE} reads from the source at once",
        ),
        _row("RQ4 186 GPUs, no load limit, s", p["rq4_186"], pools["pool_unlimited"]),
        _row("RQ4 186 GPUs, no limit, peer transfer, s", p["rq4_186"], pools["pool_peer"]),
    ]
    print("\n".join(lines))
    if not args.quick:
        sensitivity(fitted)
    print(f"[{time.perf_counter() - began:.0f} s, load average {_load()}]")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "paper.json").write_text(json.dumps(out, indent=1, default=str))


def sensitivity(fitted: paper.Params) -> None:
    """The predictions under other assumptions (refitted where the fit depends on it)."""
    print("sensitivity: the TITAN X's slowdown (refitted)")
    for slowdown in (1.25, 2.8):
        params = paper.fit(replace(fitted, titanx_slowdown=slowdown))
        rq3 = paper.rq3(params)
        rq4 = paper.rq4(params)
        print(
            f"  {slowdown}: claim {params.claim_seconds:.4f} s, init {params.init_seconds:.1f} s,"
            f" source {params.source_seconds:.1f} s; RQ3 partial {rq3['partial']:,.0f} full "
            f"{rq3['full']:,.0f}; RQ4 186 {rq4['pool_defaults']:,.0f} s, small "
            f"{rq4['small']}"
        )
    print("sensitivity: claims per task (refitted)")
    for batch in (50, 200):
        params = paper.fit(replace(fitted, claims_per_task=batch))
        rq2 = paper.rq2(params)
        print(
            f"  {batch}: init {params.init_seconds:.1f} s, source {params.source_seconds:.1f} s;"
            f" RQ2 partial at 1: {rq2['partial_batch1']:,.0f} s, full spread "
            f"{100 * float(rq2['full_spread']):.1f}%"  # type: ignore[arg-type]
        )
    print("sensitivity: the 18 models' speeds (RQ4)")
    for label, slowdown in (("every model an A10", 1.0), ("every model 1.5x an A10", 1.5)):
        rq4 = paper.rq4(fitted, slowdown=slowdown)
        print(
            f"  {label}: 186 GPUs {rq4['pool_defaults']:,.0f} s (no limit "
            f"{rq4['pool_unlimited']:,.0f} s); small {rq4['small']}"
        )
    print("sensitivity: RQ3's window")
    for window in (900.0, 2700.0):
        rq3 = paper.rq3(fitted, window=window)
        print(
            f"  {window:.0f} s: partial {rq3['partial']:,.0f}, full {rq3['full']:,.0f} "
            f"({rq3['full'] / max(1, rq3['partial']) - 1:+.1%})"
        )


def do_control(args: argparse.Namespace) -> None:
    workload = from_spec(
        "control plane",
        {"contexts": {"m": {}}, "stages": [{"rule": "infer", "context": "m", "count": args.jobs}]},
    )
    workload.contexts["m"].load = {LoadKind.SOURCE: 20.0, LoadKind.CACHE: 5.0}
    times = JobTimes(item={("infer", "a10"): 2.0}, cv=0.2)
    options = Options(
        log=False, snakemake_job_seconds=0.0, jobs_per_second=1e9, jobs=args.queue * args.servers
    )
    began = time.perf_counter()
    fleet = Fleet([ServerKind("a10", args.servers)])
    result = Simulation(workload, fleet, times, options=options).run()
    print(
        f"{args.servers} servers, {args.jobs} jobs, --jobs {options.jobs}: dispatch CPU "
        f"{result.dispatch_cpu:.1f} s = {1000 * result.cpu_per_job:.2f} ms a job "
        f"({result.stimuli} stimuli, {1000 * result.dispatch_cpu / result.stimuli:.3f} ms each);"
        f" simulated makespan {result.makespan:.0f} s in {time.perf_counter() - began:.0f} s "
        f"of wall; placed {result.placed}; load average {_load()}"
    )


def _defaults() -> str:
    peer = "on" if PEER_TRANSFERS else "off"
    return f"{LOADS_PER_SOURCE} reads from the source at once, peer transfer {peer}"


def do_rq4_wall(args: argparse.Namespace) -> None:
    """RQ4 at 186 GPUs with the plugin's defaults (described in full), then the other
    pools of :data:`paper.RQ4_POOLS` (a makespan each), with their wall times."""
    params = paper.Params(claim_seconds=0.3, init_seconds=30.0, source_seconds=60.0)
    for name, limit, peer in paper.RQ4_POOLS:
        began = time.perf_counter()
        result = paper.rq4_pool(params, limit, peer)
        wall = time.perf_counter() - began
        reads = f"{limit} reads from the source at once" if limit else "no limit on reads"
        what = f"{reads}, peer transfer {'on' if peer else 'off'}"
        if name == "pool_defaults":
            print(f"RQ4 at 186 GPUs, the plugin's defaults ({_defaults()}):")
            print(describe(result))
            print(f"RQ4 at 186 GPUs simulated in {wall:.1f} s; load {_load()}")
        else:
            print(
                f"{name} ({what}): makespan {result.makespan:,.0f} s, loads {result.loads}, "
                f"loading_source {result.ledger.hours().get('loading_source', 0.0):.2f} h; "
                f"simulated in {wall:.1f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True)
    sub = commands.add_parser("replay")
    sub.add_argument("catalog")
    sub.add_argument("--snakefile", type=Path)
    sub.add_argument("--config", nargs="*", default=[])
    sub.add_argument("--label", default="")
    sub.add_argument("--pool", type=Path, help="pilots.json: also simulate the run's pool")
    sub.set_defaults(func=do_replay)
    sub = commands.add_parser("paper")
    sub.add_argument("--out", type=Path)
    sub.add_argument("--quick", action="store_true")
    sub.set_defaults(func=do_paper)
    sub = commands.add_parser("control")
    sub.add_argument("--servers", type=int, default=186)
    sub.add_argument("--jobs", type=int, default=100_000)
    sub.add_argument("--queue", type=int, default=1)
    sub.set_defaults(func=do_control)
    sub = commands.add_parser("rq4-wall")
    sub.set_defaults(func=do_rq4_wall)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
