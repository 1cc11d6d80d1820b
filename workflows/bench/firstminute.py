"""The first minute: whole-process wall times of a small run against the bare loop.

The paper's RQ1 shape at small size: 128 claims scored with one template in 8 verify
jobs of 16, on 2 context servers (``--jobs 2 --context-servers 2``), the weights
converted beforehand. The bare loop is one process that loads the model from the
converted cache once and scores the same 128 claims in the same 8 jobs of 16, the
limit a run cannot beat. Both are timed from the process's start to its exit (the
start-up and shutdown this benchmark is about; ``factcheck.py`` measures a scoring
span instead). Also measured, per run of ``snakemake``:

- start: from the command's start to the first context job's start on a server;
- the executor's own start-up steps (its ``--verbose`` breakdown, from the run's log);
- shutdown: from the last job's report to the process's exit, on a run of 30 context
  jobs of 0.1 s (every job a context job, so the last report is the last job's);
- the cold variant: a loader that dequantises the GGUF on every load, no cache.

    python workflows/bench/firstminute.py [--repeats 5] [--out DIR]
    python workflows/bench/compare.py --old ../parent --new . --repeats 5 \\
        --script workflows/bench/firstminute.py firstminute -- --repeats 1

With ``--tree T`` (compare.py) the runs use that source tree's plugin.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
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
CONFIG = ["n_claims=128", "claims_per_job=16", "templates=[qa_yes_no]", "generated_pool=2000"]
GGUF_LOADER = "../llm/smollm2.py:load_from_gguf"

BARE = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [sys.argv[1] + "/factcheck/scripts", sys.argv[1] + "/llm"]
    import claimgen, factcheck, smollm2
    model = smollm2.load_from_gguf() if sys.argv[2] == "cold" else smollm2.load_model()
    records = factcheck.select_claims(claimgen.generate(2000, 7), n_claims=128, nei="drop",
                                      seed=7, calibration_fraction=0.25)
    template = factcheck.load_template(sys.argv[1] + "/factcheck/templates/qa_yes_no.yaml")
    true_id, false_id = model.answer_ids(template.true_word, template.false_word, template.name)
    prompts = [template.render(r["claim"], model.tokenizer) for r in records]
    for start in range(0, len(prompts), 16):
        model.score(prompts[start:start + 16], true_id, false_id, batch_size=8)
""")


def _copy(tree: Path, root: Path) -> Path:
    """A fresh copy of the workflow and its loader (the bare loop reads the same files)."""
    workdir = Path(tempfile.mkdtemp(dir=root, prefix="run-"))
    shutil.copytree(
        tree / "workflows/factcheck",
        workdir / "factcheck",
        ignore=shutil.ignore_patterns("results", ".snakemake"),
    )
    shutil.copytree(tree / "workflows/llm", workdir / "llm")
    return workdir


def bare(tree: Path, root: Path, variant: str) -> float:
    """Wall seconds of the bare loop, process start to exit."""
    workdir = _copy(tree, root)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", BARE, str(workdir), variant],
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    wall = time.perf_counter() - started
    shutil.rmtree(workdir, ignore_errors=True)
    return wall


def workflow(tree: Path, root: Path, variant: str) -> dict[str, Any]:
    """One ``snakemake`` run of the workflow: its wall, start and start-up steps."""
    workdir = _copy(tree, root)
    config = [*CONFIG, *([f"loader={GGUF_LOADER}"] if variant == "cold" else [])]
    args = [SNAKEMAKE, "-s", "Snakefile", "-d", ".", "--workflow-profile", "none"]
    args += ["--scheduler", "greedy", "--executor", "context", "--jobs", "2"]
    args += ["--context-servers", "2", "--verbose", "--config", *config]
    began = time.time()
    done = subprocess.run(
        args,
        cwd=workdir / "factcheck",
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(tree)},
    )
    wall = time.time() - began
    if done.returncode != 0:
        raise SystemExit(f"snakemake failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    summary = json.loads(
        sorted((workdir / "factcheck/.snakemake/context/runs").glob("*.json"))[-1].read_text()
    )
    jobs = summary["jobs"]
    result = {
        "wall": wall,
        "first_job": min(j["started"] for j in jobs) - began,
        "per_server": sorted(
            sum(1 for j in jobs if j["server"] == s) for s in {j["server"] for j in jobs}
        ),
    }
    # The executor's --verbose line: "start-up (s): certificates 0.31, ...".
    line = re.search(r"start-up \(s\): (.*)", done.stdout + done.stderr)
    if line:
        steps, _, total = line.group(1).partition("; ")
        for part in steps.split(", "):
            name, _, seconds = part.rpartition(" ")
            with contextlib.suppress(ValueError):  # an older tree's line may differ
                result[f"startup_{name.replace(' ', '_').replace('/', '_')}"] = float(seconds)
        with contextlib.suppress(ValueError, IndexError):
            result["startup_total"] = float(total.split()[0])
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def shutdown(tree: Path, root: Path) -> float:
    """Seconds from the last job's report to the process's exit, 30 context jobs."""
    workdir = Path(tempfile.mkdtemp(dir=root, prefix="shutdown-"))
    shutil.copytree(tree / "tests/workflows/reuse", workdir, dirs_exist_ok=True)
    args = [SNAKEMAKE, "--executor", "context", "--jobs", "4", "--context-servers", "2"]
    args += ["--quiet", "rules", "--config", "count=30", "sleep=0.1"]
    done = subprocess.run(
        args,
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, "TOY_LOAD_SECONDS": "0", "PYTHONPATH": str(tree)},
    )
    exited = time.time()
    if done.returncode != 0:
        raise SystemExit(f"snakemake failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    summary = json.loads(
        sorted((workdir / ".snakemake/context/runs").glob("*.json"))[-1].read_text()
    )
    last = max(j["reported"] for j in summary["jobs"])
    shutil.rmtree(workdir, ignore_errors=True)
    return exited - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=REPO, help="the plugin's source tree")
    parser.add_argument("--no-cold", action="store_true", help="leave out the cold variant")
    parser.add_argument("--out", type=Path, default=None, help="write firstminute.json here")
    args = parser.parse_args()
    tree = args.tree.resolve()
    root = Path(tempfile.mkdtemp(prefix="bench-firstminute-"))
    sys.path.insert(0, str(tree / "workflows/llm"))
    import smollm2

    smollm2.load_model()  # the converted cache, made once before anything is timed
    runs: dict[str, list[Any]] = {"bare": [], "snakemake": [], "shutdown": []}
    runs |= {"bare_cold": [], "snakemake_cold": []}
    for repeat in range(args.repeats):
        print(f"[{repeat + 1}/{args.repeats}] bare, snakemake, shutdown", flush=True)
        # Alternate the order: neither side always runs on a machine the other warmed.
        pair = [("bare", lambda: bare(tree, root, "warm"))]
        pair.append(("snakemake", lambda: workflow(tree, root, "warm")))
        for name, measure in pair if repeat % 2 == 0 else pair[::-1]:
            runs[name].append(measure())
        runs["shutdown"].append(shutdown(tree, root))
        if not args.no_cold:
            runs["bare_cold"].append(bare(tree, root, "cold"))
            runs["snakemake_cold"].append(workflow(tree, root, "cold"))
    shutil.rmtree(root, ignore_errors=True)

    def median(values: list[float]) -> float:
        return statistics.median(values)

    results: dict[str, Any] = {
        "bare_wall": median(runs["bare"]),
        "snakemake_wall": median([r["wall"] for r in runs["snakemake"]]),
        "first_job": median([r["first_job"] for r in runs["snakemake"]]),
        "shutdown": median(runs["shutdown"]),
        "most_jobs_on_one_server": median([max(r["per_server"]) for r in runs["snakemake"]]),
    }
    results["bare_over_snakemake"] = results["bare_wall"] / results["snakemake_wall"]
    steps = sorted({k for r in runs["snakemake"] for k in r if k.startswith("startup_")})
    for step in steps:
        results[step] = median([r.get(step, 0.0) for r in runs["snakemake"]])
    if not args.no_cold:
        results["bare_cold_wall"] = median(runs["bare_cold"])
        results["snakemake_cold_wall"] = median([r["wall"] for r in runs["snakemake_cold"]])
        results["cold_first_job"] = median([r["first_job"] for r in runs["snakemake_cold"]])
    results["load_average"] = os.getloadavg()[0]
    print(
        textwrap.dedent(f"""
        first minute, medians of {args.repeats} (tree {tree}):
          bare loop wall               {results["bare_wall"]:7.2f} s
          snakemake wall               {results["snakemake_wall"]:7.2f} s
          bare / snakemake             {results["bare_over_snakemake"]:7.3f}   (target >= 0.90)
          start to first context job   {results["first_job"]:7.2f} s   (target <= 3.0)
          last report to exit          {results["shutdown"]:7.2f} s   (target <= 0.5)""")
    )
    for step in steps:
        print(f"  start-up: {step.removeprefix('startup_'):<21}{results[step]:7.2f} s")
    if not args.no_cold:
        print(f"  cold: bare {results['bare_cold_wall']:.2f} s, snakemake ", end="")
        print(
            f"{results['snakemake_cold_wall']:.2f} s, first job {results['cold_first_job']:.2f} s"
        )
    print("  jobs per server:", [r["per_server"] for r in runs["snakemake"]])
    print(json.dumps({"runs": runs, "results": results}))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "firstminute.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
