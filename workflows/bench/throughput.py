"""The executor at Snakemake's speed: jobs per second of no-op context jobs beside
Snakemake's own ``--touch`` executor on the same Snakefile, in one run.

Each cell runs ``snakemake`` on a DAG of N independent no-op jobs (a context whose loader
returns a dict, a script writing one line) under ``--executor context`` with S servers
of the embedded cluster, ``--jobs J`` and one scheduler (Snakemake's default ``ilp`` or
``greedy``). Beside it, once per size, the same DAG under ``--touch --cores J``:
Snakemake's floor, its loop with no job run. Snakemake always selects greedily under
``--touch`` (its ``api.py``), so the one floor serves both schedulers.

The rate is N-1 over the span from the first job's "Finished jobid" line in Snakemake's
log to the last's, stamped as the lines arrive; the span leaves out the run's start and
end, which ``firstminute.py`` measures. The touch executor sleeps 0.1 s per job whose
outputs exist, so its outputs are left missing: it then only warns. With
``--profile-out`` each context cell records a py-spy profile of the Snakemake process
and the share of its samples with a frame of the plugin's (its package, Dask's client,
Tornado, SQLAlchemy, TLS) and of the catalog's.

    pip install -e ".[profile]"   # py-spy, for --profile-out
    python workflows/bench/throughput.py --out /tmp/tp [--sizes 2000 8000] \\
        [--servers 2 64] [--schedulers ilp greedy] [--profile-out DIR]

Writes ``throughput.json`` in ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
SNAKEFILE = textwrap.dedent("""
    from snakemake_executor_context import declare_context

    declare_context(config, "noop", "loader.py:load")

    rule all:
        input: expand("out/{i}.txt", i=range(int(config["size"])))

    rule noop:
        output: "out/{i}.txt"
        resources: context="noop"
        script: "noop.py"
""")
LOADER = "def load():\n    return {'loaded': True}\n"
SCRIPT = textwrap.dedent("""
    with open(snakemake.output[0], "w") as f:
        f.write("done\\n")
""")
PLUGIN_FRAMES = (
    "snakemake_executor_context", "distributed/", "tornado/", "sqlalchemy/", "ssl",
)  # fmt: skip
SNAKEMAKE_FRAMES = ("snakemake/", "snakemake_interface", "pulp/")


def workdir_for(size: int) -> Path:
    """A fresh working directory holding the Snakefile, its loader and its script."""
    workdir = Path(tempfile.mkdtemp(prefix=f"throughput-{size}-"))
    for name, text in {"Snakefile": SNAKEFILE, "loader.py": LOADER, "noop.py": SCRIPT}.items():
        (workdir / name).write_text(text)
    return workdir


def plugin_share(folded: Path) -> dict[str, float]:
    """Shares of a py-spy ``--format raw --gil`` profile's samples (the thread holding
    the interpreter lock) by whose code runs: each sample belongs to its innermost
    frame of the plugin (its package, Dask's client, Tornado, SQLAlchemy, TLS) or of
    Snakemake (its packages, and PuLP under its selector). An asyncio frame belongs to
    whoever runs the loop: Dask's client thread, or Snakemake's own ``async_run`` (5%
    of the samples at 2,000 jobs, counted as the plugin's before 2026-12-06).
    Snakemake's selector called through the executor's thinning is Snakemake's; the
    executor's ``run_job`` called by Snakemake is the plugin's. Also the catalog's
    share alone."""
    total = plugin = catalog = 0
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            # py-spy --nonblocking can read a frame's name as it changes: a name with a
            # newline in it splits its sample over two lines (seen once in 2,000 jobs).
            continue
        count = int(count_text)
        total += count
        for frame in reversed(stack.split(";")):
            if any(mark in frame for mark in SNAKEMAKE_FRAMES):
                break
            if any(mark in frame for mark in PLUGIN_FRAMES):
                plugin += count
                break
        if "sqlalchemy/" in stack or "snakemake_executor_context/catalog" in stack:
            catalog += count
    return {"plugin_share": plugin / max(total, 1), "catalog_share": catalog / max(total, 1)}


def cell(
    size: int, flags: list[str], profile: Path | None = None, keep: bool = False
) -> dict[str, float]:
    """One snakemake run: its rate, wall and CPU, and (profiled) the plugin's share."""
    workdir = workdir_for(size)
    try:
        command = [str(BIN / "snakemake"), "all", "--config", f"size={size}", *flags]
        started = time.monotonic()
        before = os.times()
        proc = subprocess.Popen(
            command, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        spy = None
        if profile is not None:
            spy = subprocess.Popen(
                [str(BIN / "py-spy"), "record", "--pid", str(proc.pid), "--format", "raw",
                 "--rate", "50", "--gil", "--output", str(profile), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        assert proc.stdout is not None
        cpu = ProcessCpu(proc.pid)
        cpu.start()
        finished: list[float] = []
        tail: list[str] = []
        selected = None
        for line in proc.stdout:
            if line.startswith("Finished jobid") and "(Rule: noop)" in line:
                finished.append(time.monotonic())
            elif selected is None and line.startswith("Select jobs to execute"):
                selected = time.monotonic()
            tail = [*tail[-40:], line]
        proc.wait()
        wall = time.monotonic() - started
        after = os.times()
        cpu.stop()
        if spy is not None:
            spy.wait(timeout=60)
        if proc.returncode != 0 or len(finished) != size:
            raise SystemExit(f"snakemake {flags}: {len(finished)} of {size}:\n{''.join(tail)}")
        if "--touch" not in flags:
            missing = [i for i in range(size) if not (workdir / "out" / f"{i}.txt").exists()]
            if missing:
                raise SystemExit(f"snakemake {flags}: outputs missing: {missing[:10]}")
        span = finished[-1] - finished[0]
        result = {
            "jobs_per_s": (size - 1) / max(span, 1e-9),
            # From the first selection: a group's members end together, so the span
            # between ends leaves out the first group's run.
            "jobs_per_s_from_first_selection": size / (finished[-1] - (selected or started)),
            "most_loads_on_a_server": _most_loads(workdir),
            "wall_s": wall,
            "snakemake_cpu_s": (after.children_user + after.children_system)
            - (before.children_user + before.children_system),
            **{f"cpu_ms_per_job_{role}": 1000 * seconds / size
               for role, seconds in cpu.by_role().items()},
        }  # fmt: skip
        if profile is not None and profile.exists():
            result |= plugin_share(profile)
        return result
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


class ProcessCpu(threading.Thread):
    """The CPU time of each process of a run, by role, sampled every 0.2 s while it
    runs (a process's last sample before it exits is its total): Snakemake's own, the
    embedded cluster's (its scheduler, the hub and the catalog's writer), each server
    (a multi-threaded process under the cluster's forkserver) and what the servers ran
    (zygotes, job processes: the ones that lived past a sample)."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self._last: dict[int, tuple[str, float]] = {}
        self._stopped = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            top = psutil.Process(self.root)
        except psutil.Error:
            return
        while not self._stopped.is_set():
            try:
                tree = [top, *top.children(recursive=True)]
            except psutil.Error:
                break
            for process in tree:
                try:
                    with process.oneshot():
                        times = process.cpu_times()
                        role = self._role(process)
                except psutil.Error:
                    continue
                self._last[process.pid] = (role, times.user + times.system)
            self._stopped.wait(0.2)

    def _role(self, process: Any) -> str:
        if process.pid == self.root:
            return "snakemake"
        if process.ppid() == self.root:
            return "cluster"
        command = " ".join(process.cmdline())
        if "cluster.serve" in command and process.num_threads() > 1:
            return "server"
        return "servers_children"

    def stop(self) -> None:
        """Stop sampling (after the run's process has exited)."""
        self._stopped.set()
        self.join(5)

    def by_role(self) -> dict[str, float]:
        """Seconds of CPU by role; a server's is the mean over the servers."""
        totals: dict[str, float] = {}
        servers = 0
        for role, seconds in self._last.values():
            totals[role] = totals.get(role, 0.0) + seconds
            servers += role == "server"
        if servers:
            totals["server"] /= servers
        return totals


def _most_loads(workdir: Path) -> int:
    """The most context loads any one server made, from the run's catalog (0: none)."""
    import sqlite3

    catalog = workdir / ".snakemake/context/catalog.db"
    if not catalog.exists():
        return 0
    with sqlite3.connect(catalog) as db:
        query = "SELECT count(*) FROM placements GROUP BY server_id"
        return max((count for (count,) in db.execute(query)), default=0)


def idle_fleet(servers: int) -> dict[str, float]:
    """``snakemake-context up --servers N``: seconds to start, and the idle servers'
    memory (RSS and USS per server process, the cluster process apart), then down."""
    import psutil

    directory = Path(tempfile.mkdtemp(prefix=f"throughput-up-{servers}-"))
    scheduler_file = directory / "scheduler.json"
    cli = [str(BIN / "snakemake-context")]
    try:
        started = time.monotonic()
        subprocess.run(
            [*cli, "up", "--servers", str(servers), "--scheduler-file", str(scheduler_file)],
            cwd=directory, check=True, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        took = time.monotonic() - started
        time.sleep(5)  # idle
        # Its forkserver and servers are forks of it, with its command line.
        (cluster,) = [
            p for p in psutil.process_iter(["cmdline"])
            if str(scheduler_file) in " ".join(p.info["cmdline"] or ())
            and "cluster.serve" in " ".join(p.info["cmdline"] or ())
            and "cluster.serve" not in " ".join(p.parent().cmdline())
        ]  # fmt: skip
        workers = [p for p in cluster.children(recursive=True) if p.num_threads() > 1]
        infos = [p.memory_full_info() for p in workers]
        rss = sorted(info.rss for info in infos)[-servers:]
        uss = sorted(info.uss for info in infos)[-servers:]
        return {
            "servers": servers,
            "start_s": took,
            "rss_mb_per_server": sum(rss) / len(rss) / 1e6,
            "uss_mb_per_server": sum(uss) / len(uss) / 1e6,
            "cluster_process_rss_mb": cluster.memory_info().rss / 1e6,
        }
    finally:
        subprocess.run([*cli, "down", "--scheduler-file", str(scheduler_file)],
                       capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(directory, ignore_errors=True)


def cpu_line(result: dict[str, Any]) -> str:
    """The CPU per job of each process's role, for the table."""
    roles = ("snakemake", "cluster", "server", "servers_children")
    return " ".join(
        f"{role} {result[f'cpu_ms_per_job_{role}']:.1f}"
        for role in roles
        if f"cpu_ms_per_job_{role}" in result
    )


def main() -> None:
    """Run every cell and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=int, nargs="*", default=[2000, 8000])
    parser.add_argument("--servers", type=int, nargs="+", default=[2, 64])
    parser.add_argument("--schedulers", nargs="+", default=["ilp", "greedy"])
    parser.add_argument("--jobs", type=int, default=8, help="--jobs (at least the servers)")
    parser.add_argument("--profile-out", type=Path, help="py-spy profiles of the context runs")
    parser.add_argument(
        "--idle", type=int, nargs="*", default=[], help="`up` fleets to start and weigh idle"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profile_out:
        args.profile_out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    for size in args.sizes:
        touch = cell(size, ["--touch", "--cores", str(args.jobs)])
        for scheduler in args.schedulers:
            for servers in args.servers:
                jobs = max(args.jobs, servers)
                profile = (
                    args.profile_out / f"{size}-{servers}-{scheduler}.txt"
                    if args.profile_out
                    else None
                )
                flags = ["--executor", "context", "--jobs", str(jobs)]
                flags += ["--context-servers", str(servers), "--scheduler", scheduler]
                context = cell(size, flags, profile)
                row: dict[str, object] = {
                    "jobs": size, "servers": servers, "max_jobs": jobs, "scheduler": scheduler,
                    "touch_jobs_per_s": touch["jobs_per_s"], **context,
                    "ratio_to_touch": context["jobs_per_s"] / touch["jobs_per_s"],
                }  # fmt: skip
                rows.append(row)
                print(
                    f"{size:>6} jobs {servers:>3} servers --jobs {jobs:>3} {scheduler:<6} "
                    f"context {context['jobs_per_s']:6.1f}/s  touch {touch['jobs_per_s']:6.1f}/s"
                    f"  ratio {row['ratio_to_touch']:.2f}"
                    + (f"  plugin {context['plugin_share']:.0%}" if "plugin_share" in context
                       else "")
                    + "  CPU ms/job " + cpu_line(context),
                    flush=True,
                )  # fmt: skip
    fleets = [idle_fleet(servers) for servers in args.idle]
    for fleet in fleets:
        print(
            f"up --servers {fleet['servers']:.0f}: started in {fleet['start_s']:.1f} s, "
            f"{fleet['rss_mb_per_server']:.0f} MB RSS ({fleet['uss_mb_per_server']:.0f} MB "
            "USS) per idle server",
            flush=True,
        )
    result = {"cells": rows, "idle_fleets": fleets}
    (args.out / "throughput.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
