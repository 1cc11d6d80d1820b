"""A small run's whole cost against the local executor's: wall, first output, CPU.

A 4-job workflow whose context loads nothing, run three ways per repeat (the order
rotates between repeats, so that no side always runs on a machine the other warmed):

- ``snakemake --cores 2``: the local executor, each job loading in its own process;
- ``snakemake --executor context --jobs 4 --context-servers 2``: the embedded cluster.

Also measured: from the last output's write to the command's exit (the run's end).

Each run is put in its own cgroup v1 ``cpuacct`` group before ``snakemake`` starts, so
every process it starts (the cluster, its servers, the forkserver, the resource
tracker) is counted, and the group is read only once its last process has exited.
Needs to run as root on a machine that mounts ``/sys/fs/cgroup/cpuacct``.

    python workflows/bench/lightstart.py [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
JOBS = 4

SNAKEFILE = textwrap.dedent("""
    from snakemake_executor_context import declare_context

    declare_context(config, "noop", "loaders.py:load_noop")

    rule all:
        input: expand("out/{i}.txt", i=range(4))

    rule use:
        output: "out/{i}.txt"
        resources: context="noop"
        script: "use.py"
""")
LOADER = "def load_noop():\n    return 1\n"
SCRIPT = textwrap.dedent("""
    from snakemake_executor_context import load_context

    value = load_context(snakemake)
    with open(snakemake.output[0], "w") as f:
        f.write(f"{value}\\n")
""")

ARGS = {
    "local": ["--cores", "2"],
    "context": ["--executor", "context", "--jobs", str(JOBS), "--context-servers", "2"],
}


def _workdir(root: Path) -> Path:
    workdir = Path(tempfile.mkdtemp(dir=root, prefix="run-"))
    (workdir / "Snakefile").write_text(SNAKEFILE)
    (workdir / "loaders.py").write_text(LOADER)
    (workdir / "use.py").write_text(SCRIPT)
    return workdir


def _join_group(group: Path) -> None:
    (group / "cgroup.procs").write_text(str(os.getpid()))


def run(kind: str, root: Path, tree: Path) -> dict[str, float]:
    """One run of ``kind``: wall, first output's time and the CPU-seconds of its group."""
    workdir = _workdir(root)
    group = CPUACCT / f"lightstart-{os.getpid()}-{kind}"
    group.mkdir()
    try:
        began = time.time()
        done = subprocess.run(
            [SNAKEMAKE, "--quiet", *ARGS[kind]],
            cwd=workdir,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(tree)},
            preexec_fn=lambda: _join_group(group),
        )
        wall = time.time() - began
        if done.returncode != 0:
            raise SystemExit(f"{kind} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        # Whatever the run left running still counts (a cluster that shuts down late).
        deadline = time.time() + 30
        while (group / "cgroup.procs").read_text().strip() and time.time() < deadline:
            time.sleep(0.05)
        left = (group / "cgroup.procs").read_text().split()
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (CPUACCT / "cgroup.procs").write_text(pid)
        group.rmdir()
    outputs = sorted(workdir.glob("out/*.txt"))
    if len(outputs) != JOBS:
        raise SystemExit(f"{kind}: {len(outputs)} outputs, not {JOBS}")
    first = min(p.stat().st_mtime for p in outputs) - began
    tail = began + wall - max(p.stat().st_mtime for p in outputs)
    return {"wall": wall, "first_output": first, "cpu": cpu, "tail": tail, "left": len(left)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=REPO, help="the plugin's source tree")
    parser.add_argument("--out", type=Path, default=None, help="write lightstart.json here")
    args = parser.parse_args()
    if not os.access(CPUACCT, os.W_OK):
        raise SystemExit(f"{CPUACCT} is not writable here: run as root on cgroup v1")
    # As an installed package is: compiled. Where PYTHONDONTWRITEBYTECODE is set, a
    # tree without bytecode would compile the plugin in every process of every run.
    compileall.compile_dir(args.tree / "snakemake_executor_context", quiet=1)
    root = Path(tempfile.mkdtemp(prefix="bench-lightstart-"))
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in ARGS}
    kinds = list(ARGS)
    for repeat in range(args.repeats):
        order = kinds[repeat % len(kinds) :] + kinds[: repeat % len(kinds)]
        for kind in order:
            runs[kind].append(run(kind, root, args.tree.resolve()))
            print(f"[{repeat + 1}/{args.repeats}] {kind}: {runs[kind][-1]}", flush=True)
    results: dict[str, Any] = {}
    for kind in kinds:
        for measure in ("wall", "first_output", "cpu", "tail"):
            results[f"{kind}_{measure}"] = statistics.median(r[measure] for r in runs[kind])
    results["cpu_ratio"] = results["context_cpu"] / results["local_cpu"]
    results["wall_ratio"] = results["context_wall"] / results["local_wall"]
    results["first_output_later"] = results["context_first_output"] - results["local_first_output"]
    results["load_average"] = os.getloadavg()[0]
    print(f"\nmedians of {args.repeats}, every process of a run counted (cpuacct):")
    print(f"  {'':30}{'wall':>8}{'first output':>14}{'CPU-s':>8}{'last output to exit':>21}")
    for kind in kinds:
        label = " ".join(ARGS[kind])
        print(
            f"  {label[:30]:30}{results[f'{kind}_wall']:8.2f}"
            f"{results[f'{kind}_first_output']:14.2f}{results[f'{kind}_cpu']:8.2f}"
            f"{results[f'{kind}_tail']:21.2f}"
        )
    print(
        f"  context / local: CPU {results['cpu_ratio']:.2f}x (target <= 1.5), "
        f"wall {results['wall_ratio']:.2f}x (target <= 1.3), first output "
        f"{results['first_output_later']:+.2f} s (target <= +1.0)"
    )
    print(json.dumps({"runs": runs, "results": results}))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lightstart.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
