"""What a server's per-job isolation checks cost for a job that changed nothing, before
and after, side by side in one run.

Two worker processes, one importing each tree (``--before``, e.g. an untouched copy of
an older commit, and ``--after``, this checkout), each made to look like a server: a
child subreaper whose own child (a zygote's stand-in, with threads) is recorded as
its own, idle threads, open files and sockets, Dask imported. Each round every worker
runs every check ``--jobs`` times as a no-op job meets it; the rounds alternate between
the workers, so load on the machine falls on both alike. Prints the median over the
rounds of the microseconds per job, and after/before.

    python workflows/bench/isolation.py --before /tmp/old [--after .] [--jobs 500] [--rounds 7]

The checks: ``descriptors`` (the open files before the job, and those it left),
``process-wide`` (:class:`ProcessWide`: taken, set for a job, put back), ``process
state`` (cwd, environment, tempfile's directory, modules, thread pools: set, restored),
``strays`` (the span of one in-process job: what it left running, swept), and ``one
job``: all four nested as a server runs a job (the span's watch holds a descriptor).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent("""
    import json, os, socket, subprocess, sys, threading, time
    from types import SimpleNamespace

    import distributed  # noqa: F401  (a server's modules)

    from snakemake_executor_context.server.isolation import (
        fresh_modules, process_state, thread_limits, torch_threads,
    )
    from snakemake_executor_context.server.output import _lasting_leaks, open_fds
    from snakemake_executor_context.server.processwide import ProcessWide
    from snakemake_executor_context.strays.jobsweep import JobSpans
    from snakemake_executor_context.strays.processes import OWN, become_subreaper

    become_subreaper()
    idle = threading.Event()
    for _ in range(6):  # Dask's event loop, its offload and profile threads, slots
        threading.Thread(target=idle.wait, daemon=True).start()
    held = [open(sys.executable, "rb") for _ in range(8)] + [socket.socket() for _ in range(8)]
    with OWN.starting():
        zygote = subprocess.Popen([sys.executable, "-c", (
            "import threading, time\\n"
            "for _ in range(2):\\n"
            "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\\n"
            "time.sleep(3600)"
        )])
        OWN.add(zygote.pid, "zygote")
    time.sleep(0.5)
    workdir = sys.argv[1]
    spec = SimpleNamespace(key="job", workdir=workdir, envvars={}, threads=1)
    spans = JobSpans("a benchmark", lambda *events: None)

    def descriptors():
        _lasting_leaks(open_fds())

    def process_wide():
        saved = ProcessWide.now()
        saved.for_a_job()
        saved.restore()

    def state():
        with fresh_modules([workdir], frozenset), process_state(spec):
            with thread_limits(spec.threads, torch_threads):
                pass

    def strays():
        spans.enter(spec)
        spans.leave(spec)

    def one_job():  # all of them, nested as a server runs a job
        spans.enter(spec)
        before = open_fds()
        saved = ProcessWide.now()
        saved.for_a_job()
        state()
        saved.restore()
        _lasting_leaks(before)
        spans.leave(spec)

    CHECKS = {"descriptors": descriptors, "process-wide": process_wide,
              "process state": state, "strays": strays, "one job": one_job}
    for check in CHECKS.values():
        check()
    import snakemake_executor_context
    print(json.dumps(os.path.dirname(snakemake_executor_context.__file__)), flush=True)
    for line in sys.stdin:
        jobs = int(line)
        took = {}
        for name, check in CHECKS.items():
            start = time.process_time()
            for _ in range(jobs):
                check()
            took[name] = (time.process_time() - start) / jobs * 1e6
        print(json.dumps(took), flush=True)
    zygote.kill()
    zygote.wait()
""")


def start_worker(tree: Path, workdir: Path) -> subprocess.Popen[str]:
    """A worker importing the package from ``tree`` (its root), from a neutral cwd."""
    environment = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(workdir)],
        cwd=workdir,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def round_of(worker: subprocess.Popen[str], jobs: int) -> dict[str, float]:
    """One round of every check in that worker: CPU µs per job, by check."""
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(f"{jobs}\n")
    worker.stdin.flush()
    return dict(json.loads(worker.stdout.readline()))


def run_rounds(workdir: Path, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """Both trees' workers in ``workdir``, their rounds alternating."""
    workers = {side: start_worker(tree, workdir) for side, tree in
               (("before", args.before), ("after", args.after))}  # fmt: skip
    rounds: dict[str, list[dict[str, float]]] = {side: [] for side in workers}
    for side, worker in workers.items():
        assert worker.stdout is not None
        print(f"{side}: {json.loads(worker.stdout.readline())}")
    try:
        for _ in range(args.rounds):
            for side, worker in workers.items():
                rounds[side].append(round_of(worker, args.jobs))
    finally:
        for worker in workers.values():
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait(timeout=60)
    return rounds


def main() -> None:
    """Run the rounds, alternating the two trees, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the older tree's root")
    parser.add_argument("--after", type=Path, default=REPO, help="the newer tree's root")
    parser.add_argument("--jobs", type=int, default=500, help="no-op jobs per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    # A private directory of its own: a name in /tmp could be another user's.
    with tempfile.TemporaryDirectory(prefix="isolation-bench-") as directory:
        rounds = run_rounds(Path(directory), args)
    print(f"CPU µs per no-op job, median of {args.rounds} rounds of {args.jobs} jobs")
    print(f"{'check':<16}{'before':>10}{'after':>10}{'after/before':>14}")
    for name in rounds["before"][0]:
        median = {s: statistics.median(r[name] for r in rounds[s]) for s in rounds}
        print(f"{name:<16}{median['before']:>10.1f}{median['after']:>10.1f}"
              f"{median['after'] / median['before']:>14.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
