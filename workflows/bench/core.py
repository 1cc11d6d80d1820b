"""Benchmark of the core executor, measured side by side in one run.

1. Throughput: N no-op context jobs under ``--executor context`` and ``--executor local``
   (jobs/s and their ratio; targets: context >= 10 jobs/s and >= 1.5x local).
2. Expensive context: M jobs whose loader sleeps 5 s (target: context >= 10x local).
3. Reporting latency: p50/p95 of the time from a job's end on its server to its report
   to Snakemake (from the executor's run summary).

Workers are matched: 2 context servers against ``--executor local --cores 2``.

The context runs go twice, interleaved: with TLS (the default, mutual TLS between
every part of the cluster) and without it (``SNAKEMAKE_CONTEXT_BENCH_NO_TLS`` set to
this script's pid for that one run: honoured only from the process that starts the
run, so no profile, module file or export can carry it); TLS must keep at least 90% of
the no-op throughput and the same loader speed-up (``--no-tls-baseline`` off: TLS only, as before).

    python workflows/bench/core.py [--jobs 200] [--slow-jobs 40] [--repeats 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SNAKEFILE = """
from snakemake_executor_context import declare_context

declare_context(config, "ctx", "loader.py:load", seconds=float(config["load_seconds"]))

rule all:
    input: expand("out/{i}.txt", i=range(int(config["count"])))

rule noop:
    output: "out/{i}.txt"
    resources: context="ctx", gpu=1
    script: "noop.py"
"""
LOADER = """
import time

def load(seconds):
    time.sleep(seconds)
    return {"loaded": True}
"""
SCRIPT = """
from snakemake_executor_context import load_context

load_context(snakemake)
open(snakemake.output[0], "w").close()
"""


#: The benchmark-only switch that starts the embedded cluster without TLS.
NO_TLS = "SNAKEMAKE_CONTEXT_BENCH_NO_TLS"


def run(executor: str, n: int, load_seconds: float, root: Path, tls: bool = True) -> dict:
    """One snakemake run in a fresh directory; returns wall time and the summary."""
    workdir = Path(tempfile.mkdtemp(dir=root, prefix=f"{executor}-"))
    (workdir / "Snakefile").write_text(SNAKEFILE)
    (workdir / "loader.py").write_text(LOADER)
    (workdir / "noop.py").write_text(SCRIPT)
    snakemake = str(Path(sys.executable).parent / "snakemake")
    args = [snakemake, "--config", f"count={n}", f"load_seconds={load_seconds}", "--quiet", "rules"]
    if executor == "context":
        args += ["--executor", "context", "--jobs", "8", "--context-servers", "2"]
    else:
        args += ["--executor", "local", "--cores", "2"]
    env = {name: value for name, value in os.environ.items() if name != NO_TLS}
    if not tls:
        env[NO_TLS] = str(os.getpid())  # snakemake's parent: honoured for this run only
    started = time.perf_counter()
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{executor} run failed:\n{done.stdout}\n{done.stderr}")
    summaries = sorted((workdir / ".snakemake/context/runs").glob("*.json"))
    summary = json.loads(summaries[-1].read_text()) if summaries else None
    shutil.rmtree(workdir, ignore_errors=True)
    return {"wall": wall, "summary": summary}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="no-op jobs per run")
    parser.add_argument("--slow-jobs", type=int, default=40, help="jobs with a 5 s loader")
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode, interleaved")
    parser.add_argument("--out", type=Path, default=None, help="write results.json here")
    parser.add_argument(
        "--no-tls-baseline",
        dest="baseline",
        action="store_false",
        help="skip the context runs without TLS",
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-core-"))
    rows: dict[str, list[float]] = {
        k: []
        for k in ("ctx_noop", "local_noop", "ctx_slow", "local_slow")
        + (("plain_noop", "plain_slow") if args.baseline else ())
    }
    latencies: list[float] = []
    try:
        for repeat in range(args.repeats):
            print(f"[{repeat + 1}/{args.repeats}] {args.jobs} no-op jobs ...", flush=True)
            context = run("context", args.jobs, 0.0, root)
            rows["ctx_noop"].append(context["wall"])
            if args.baseline:
                rows["plain_noop"].append(run("context", args.jobs, 0.0, root, tls=False)["wall"])
            rows["local_noop"].append(run("local", args.jobs, 0.0, root)["wall"])
            latencies += [job["reported"] - job["finished"] for job in context["summary"]["jobs"]]
            print(
                f"[{repeat + 1}/{args.repeats}] {args.slow_jobs} jobs with a 5 s loader ...",
                flush=True,
            )
            rows["ctx_slow"].append(run("context", args.slow_jobs, 5.0, root)["wall"])
            if args.baseline:
                rows["plain_slow"].append(
                    run("context", args.slow_jobs, 5.0, root, tls=False)["wall"]
                )
            rows["local_slow"].append(run("local", args.slow_jobs, 5.0, root)["wall"])
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = {key: statistics.median(values) for key, values in rows.items()}
    ctx_rate, local_rate = args.jobs / med["ctx_noop"], args.jobs / med["local_noop"]
    slow_ratio = med["local_slow"] / med["ctx_slow"]
    results = {
        "jobs": args.jobs,
        "slow_jobs": args.slow_jobs,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "walls": rows,
        "context_jobs_per_s": ctx_rate,
        "local_jobs_per_s": local_rate,
        "noop_ratio": ctx_rate / local_rate,
        "slow_ratio": slow_ratio,
        "report_latency_p50_ms": 1000 * percentile(latencies, 0.5),
        "report_latency_p95_ms": 1000 * percentile(latencies, 0.95),
        "load_average": os.getloadavg(),
    }
    if args.baseline:
        plain_rate = args.jobs / med["plain_noop"]
        results |= {
            "context_no_tls_jobs_per_s": plain_rate,
            "tls_throughput_ratio": ctx_rate / plain_rate,
            "slow_ratio_no_tls": med["local_slow"] / med["plain_slow"],
        }
    print()
    print(f"{'measure':<44}{'context':>12}{'local':>12}{'ratio':>9}  target")
    print(
        f"{args.jobs} no-op jobs, jobs/s (wall incl. start){'':<2}"
        f"{ctx_rate:>12.1f}{local_rate:>12.1f}{ctx_rate / local_rate:>8.1f}x  >=10/s, >=1.5x"
    )
    print(
        f"{args.slow_jobs} jobs, 5 s loader, wall s{'':<18}"
        f"{med['ctx_slow']:>12.1f}{med['local_slow']:>12.1f}{slow_ratio:>8.1f}x  >=10x"
    )
    print(
        f"job end on server -> reported, p50 / p95 ms{'':<1}"
        f"{results['report_latency_p50_ms']:>12.1f}{results['report_latency_p95_ms']:>12.1f}"
    )
    if args.baseline:
        plain_rate = results["context_no_tls_jobs_per_s"]
        print(
            f"TLS on / off: no-op jobs/s {ctx_rate:.1f} / {plain_rate:.1f}"
            f" ({100 * results['tls_throughput_ratio']:.0f}%, target >= 90%); 5 s loader "
            f"speed-up {slow_ratio:.1f}x / {results['slow_ratio_no_tls']:.1f}x"
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "core.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
