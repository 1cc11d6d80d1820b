"""Groups of context jobs against Snakemake's own loop: jobs per second of no-op
context jobs in groups of K (``--groups noop=shard --group-components shard=K``), beside
the same jobs ungrouped under the executor and Snakemake's ``--touch`` floor on the
same DAG, in one run, on the embedded cluster's servers.

Rates count from the first "Select jobs to execute" to the last job's end (a group's
members end together). The most context loads one server made comes from the run's
catalog: a group loads once per server for the whole run.

    python workflows/bench/groups.py --out /tmp/groups [--sizes 2000 8000] \\
        [--groups 10 50 200] [--servers 2] [--jobs 8]

With ``--factcheck R``, also the RQ1-shaped fact-check (128 claims x 4 templates, the
real model, 2 servers), R times interleaved: 32 claims a job ungrouped against 1 claim a
job, ungrouped and in groups of 32 (``--groups verify=v --group-components v=32``),
with one slot a server and with 4 (a group's members then run 4 at once, their forward
passes merged by the model's batcher).

Writes ``groups.json`` in ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from factcheck import RQ1_TEMPLATES, run_workflow
from throughput import cell, cpu_line

GROUPED = ("--groups", "verify=v", "--group-components", "v=32")
FACTCHECK = {
    "32 claims a job": (32, ()),
    "1 claim a job": (1, ()),
    "1 claim a job, groups of 32": (1, GROUPED),
    "the same, 4 slots a server": (1, (*GROUPED, "--context-slots", "4")),
}


def main() -> None:
    """Run every cell and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=int, nargs="*", default=[2000, 8000])
    parser.add_argument("--groups", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--factcheck", type=int, default=0, metavar="REPEATS")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    context = ["--executor", "context", "--jobs", str(args.jobs)]
    context += ["--context-servers", str(args.servers)]
    rows = []
    for size in args.sizes:
        touch = cell(size, ["--touch", "--cores", str(args.jobs)])
        floor = touch["jobs_per_s_from_first_selection"]
        for group in [0, *args.groups]:
            grouped = ["--groups", "noop=shard", "--group-components", f"shard={group}"]
            measured = cell(size, context + (grouped if group else []))
            rate = measured["jobs_per_s_from_first_selection"]
            row = {"jobs": size, "group": group, "touch_jobs_per_s": floor, **measured,
                   "ratio_to_touch": rate / floor}  # fmt: skip
            rows.append(row)
            print(
                f"{size:>6} jobs  {'ungrouped' if not group else f'groups of {group}':<13} "
                f"{rate:7.1f}/s  touch {floor:6.1f}/s  ratio {rate / floor:5.2f}  "
                f"loads/server <= {measured['most_loads_on_a_server']}  "
                f"wall {measured['wall_s']:.1f} s  CPU ms/job {cpu_line(measured)}",
                flush=True,
            )
    walls = factcheck(args.factcheck)
    (args.out / "groups.json").write_text(
        json.dumps({"cells": rows, "factcheck_walls": walls}, indent=1) + "\n"
    )


def factcheck(repeats: int) -> dict[str, list[float]]:
    """The fact-check's wall times per granularity, interleaved; prints medians."""
    walls: dict[str, list[float]] = {name: [] for name in FACTCHECK}
    with tempfile.TemporaryDirectory(prefix="groups-factcheck-") as root:
        for _ in range(repeats):
            for name, (claims_per_job, extra) in FACTCHECK.items():
                run = run_workflow("full", 128, RQ1_TEMPLATES, claims_per_job, Path(root), extra)
                walls[name].append(run["wall"])
    if repeats:
        base = statistics.median(walls["32 claims a job"])
        for name, seconds in walls.items():
            median = statistics.median(seconds)
            print(f"fact-check, {name:<28} {median:6.1f} s  ({median / base - 1:+.1%})")
    return walls


if __name__ == "__main__":
    main()
