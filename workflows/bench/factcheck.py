"""The paper's experiments on the fact-verification workflow, side by side in one run.

Modes (same claims, templates and micro-batch; 2 workers of 1 thread each):

- context-agnostic: ``--executor local --cores 2``, every job loads the model from the
  original GGUF file (dequantising it);
- partial-context: ``--executor local --cores 2``, every job loads the converted
  safetensors cache;
- full-context: ``--executor context`` with 2 servers: the model is loaded once per server.
- the limit: a bare Python loop, one process per worker, the model loaded once per
  process, scoring the same claims in jobs of 16 claims.

RQ1 (pinned: 128 claims x 4 templates, 32 claims per job): the three modes.
RQ2: makespan against claims_per_job, full- and partial-context.
Every measurement is repeated (default 3 times, interleaved); medians and ranges are
printed as tables, written to JSON and drawn as PNGs (rq1.png, rq2.png).

    python workflows/bench/factcheck.py [--quick] [--out bench-results/factcheck]
        [--figures docs/images]

The charts go into --out unless --figures names another directory: docs/images/ holds
the ones the docs site shows (docs/benchmarks.md), from a full run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "workflows/factcheck"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
RQ1_TEMPLATES = ["qa_yes_no", "two_shot_yes_no", "claim_true_false", "fact_check_verdict"]
RQ2_TEMPLATE = ["qa_yes_no"]
GGUF_LOADER = "../llm/smollm2.py:load_from_gguf"


def run_workflow(
    mode: str,
    n_claims: int,
    templates: list[str],
    claims_per_job: int,
    root: Path,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One snakemake run of the workflow in a fresh copy (``extra``: more flags for
    Snakemake); wall time and server stats."""
    workdir = Path(tempfile.mkdtemp(dir=root, prefix=f"{mode}-{claims_per_job}-"))
    shutil.copytree(
        WORKFLOW, workdir / "factcheck", ignore=shutil.ignore_patterns("results", ".snakemake")
    )
    shutil.copytree(REPO / "workflows/llm", workdir / "llm")
    config = [
        f"n_claims={n_claims}",
        f"claims_per_job={claims_per_job}",
        f"generated_pool={max(2000, n_claims + n_claims % 2)}",
        "templates=[" + ",".join(templates) + "]",
    ]
    if mode == "agnostic":
        config.append(f"loader={GGUF_LOADER}")
    # No workflow profile: its `executor` and `jobs` would override the matched workers.
    args = [
        SNAKEMAKE,
        "-s",
        "Snakefile",
        "-d",
        ".",
        "--workflow-profile",
        "none",
        "--scheduler",
        "greedy",
        "--quiet",
        "rules",
        "--config",
        *config,
    ]
    if mode == "full":
        args += ["--executor", "context", "--jobs", "8", "--context-servers", "2"]
    else:
        args += ["--executor", "local", "--cores", "2"]
    args += extra
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    started = time.perf_counter()
    done = subprocess.run(args, cwd=workdir / "factcheck", capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result: dict[str, Any] = {"wall": wall}
    summaries = sorted((workdir / "factcheck/.snakemake/context/runs").glob("*.json"))
    if summaries:
        jobs = json.loads(summaries[-1].read_text())["jobs"]
        # As for the bare loop, scoring starts once the model is loaded: a job that
        # loaded it starts scoring after its load.
        span = max(j["finished"] for j in jobs) - min(
            j["started"] + j["load_seconds"] for j in jobs
        )
        result["items"] = sum(j["items"] for j in jobs)
        result["scoring_span"] = span
    shutil.rmtree(workdir, ignore_errors=True)
    return result


# ------------------------------------------------------------------------------------
# The limit: a bare loop, the model loaded once per worker process.


def _limit_worker(
    jobs: list[list[str]], true_id: int, false_id: int, batch: int, queue: Any
) -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO / "workflows/llm"))
    import smollm2

    model = smollm2.load_model()
    started = time.time()
    for prompts in jobs:
        model.score(prompts, true_id, false_id, batch_size=batch)
    queue.put((started, time.time(), sum(len(j) for j in jobs)))


def run_limit(
    n_claims: int, templates: list[str], claims_per_job: int, workers: int, batch: int
) -> dict[str, Any]:
    """Score the claims x templates in jobs of ``claims_per_job`` with a bare loop."""
    sys.path[:0] = [str(WORKFLOW / "scripts"), str(REPO / "workflows/llm")]
    import claimgen
    import factcheck
    import smollm2

    tokenizer = smollm2.load_model().tokenizer  # cached: cheap
    records = factcheck.select_claims(
        claimgen.generate(max(2000, n_claims + n_claims % 2), 7),
        n_claims=n_claims,
        nei="drop",
        seed=7,
        calibration_fraction=0.25,
    )
    jobs, ids = [], set()
    for name in templates:
        template = factcheck.load_template(WORKFLOW / f"templates/{name}.yaml")
        ids.add(smollm2.answer_token_ids(tokenizer, template.true_word, template.false_word))
        prompts = [template.render(r["claim"], tokenizer) for r in records]
        jobs += [prompts[i : i + claims_per_job] for i in range(0, len(prompts), claims_per_job)]
    true_id, false_id = next(iter(ids))  # the token ids do not change the cost
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    started = time.perf_counter()
    processes = [
        context.Process(
            target=_limit_worker, args=(jobs[w::workers], true_id, false_id, batch, queue)
        )
        for w in range(workers)
    ]
    for process in processes:
        process.start()
    spans = [queue.get() for _ in processes]
    for process in processes:
        process.join()
    wall = time.perf_counter() - started
    return {
        "wall": wall,
        "items": sum(s[2] for s in spans),
        "scoring_span": max(s[1] for s in spans) - min(s[0] for s in spans),
    }


# ------------------------------------------------------------------------------------


def stats(values: list[float]) -> dict[str, float]:
    """Median and range."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 10 minutes")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results/factcheck")
    parser.add_argument(
        "--figures",
        type=Path,
        default=None,
        help="where rq1.png and rq2.png go (default: --out; the docs show docs/images)",
    )
    args = parser.parse_args()
    quick = args.quick
    repeats = args.repeats or (1 if quick else 3)
    # RQ2: the largest size must still give >= 4 jobs per server (2 servers), so 2,048
    # claims at 256 per job (1,024 at 128 for --quick). Sizes 1 and 4 score a stated
    # subset in both modes. On 2 cores a full sweep of both modes 3 times would take
    # hours (partial-context pays ~3.5 s of start-up per job): the full-context points
    # that the spread target is about are repeated; the rest runs once.
    rq2_claims = 1024 if quick else 2048
    repeated_sizes = [8, 128] if quick else [8, 32, 256]
    once = (
        []
        if quick
        else [
            ("full", 1),
            ("partial", 1),
            ("full", 4),
            ("partial", 4),
            ("partial", 32),
            ("partial", 256),
        ]
    )
    subset = {1: 64, 4: 256}
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench-factcheck-"))
    log: dict[str, Any] = {"repeats": repeats, "quick": quick, "cpu_count": os.cpu_count()}
    began = time.perf_counter()

    def note(text: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f} s] {text}", flush=True)

    sys.path.insert(0, str(REPO / "workflows/llm"))
    import smollm2

    note("warming the converted-weights cache (partial and full context load from it)")
    smollm2.load_model()

    rq1: dict[str, list[float]] = {"agnostic": [], "partial": [], "full": []}
    limit16: dict[str, list[float]] = {"limit": [], "full": []}
    rq2: dict[str, dict[int, list[float]]] = {"full": {}, "partial": {}}
    try:
        for repeat in range(repeats):
            for mode in ("agnostic", "partial", "full"):
                note(f"RQ1 {mode} (repeat {repeat + 1}/{repeats})")
                rq1[mode].append(run_workflow(mode, 128, RQ1_TEMPLATES, 32, root)["wall"])
            note(f"limit vs full context at 16 claims per job (repeat {repeat + 1})")
            bare = run_limit(128, RQ1_TEMPLATES, 16, workers=2, batch=8)
            full = run_workflow("full", 128, RQ1_TEMPLATES, 16, root)
            limit16["limit"].append(bare["items"] / bare["scoring_span"])
            limit16["full"].append(full["items"] / full["scoring_span"])
            for size in repeated_sizes:
                note(f"RQ2 full claims_per_job={size} ({rq2_claims} claims)")
                wall = run_workflow("full", rq2_claims, RQ2_TEMPLATE, size, root)["wall"]
                rq2["full"].setdefault(size, []).append(wall / rq2_claims * 1000)
        for mode, size in once:
            claims = subset.get(size, rq2_claims)
            note(f"RQ2 {mode} claims_per_job={size} ({claims} claims, once)")
            wall = run_workflow(mode, claims, RQ2_TEMPLATE, size, root)["wall"]
            rq2[mode].setdefault(size, []).append(wall / claims * 1000)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    log["rq1"] = {mode: {"walls": walls, **stats(walls)} for mode, walls in rq1.items()}
    log["limit16_items_per_s"] = {k: {"values": v, **stats(v)} for k, v in limit16.items()}
    log["rq2_seconds_per_1000_claims"] = {
        mode: {str(size): {"values": v, **stats(v)} for size, v in sizes.items()}
        for mode, sizes in rq2.items()
    }
    sizes_run = sorted({size for mode in rq2.values() for size in mode})
    log["rq2_claims"] = {str(s): subset.get(s, rq2_claims) for s in sizes_run}
    log["elapsed_s"] = time.perf_counter() - began
    r1 = {mode: log["rq1"][mode]["median"] for mode in rq1}
    full_sizes = {
        int(s): v["median"] for s, v in log["rq2_seconds_per_1000_claims"]["full"].items()
    }
    big = [v for s, v in full_sizes.items() if s >= 8]
    spread = (max(big) - min(big)) / min(big) if big else float("nan")
    throughput = log["limit16_items_per_s"]
    log["targets"] = {
        "full_over_partial": r1["full"] / r1["partial"],
        "full_over_agnostic": r1["full"] / r1["agnostic"],
        "full_spread_8_to_256": spread,
        "full_over_limit_at_16": throughput["full"]["median"] / throughput["limit"]["median"],
    }
    (args.out / "factcheck.json").write_text(json.dumps(log, indent=1))
    print_tables(log)
    figures = args.figures or args.out
    figures.mkdir(parents=True, exist_ok=True)
    draw(log, figures)


def print_tables(log: dict[str, Any]) -> None:
    """The tables docs/benchmarks.md quotes."""
    rq1 = log["rq1"]
    print(f"\nRQ1: 128 claims x 4 templates, 32 claims per job, {log['repeats']} repeat(s)")
    print(f"{'mode':<20}{'median s':>10}{'range':>18}{'vs agnostic':>13}")
    for mode in ("agnostic", "partial", "full"):
        s = rq1[mode]
        print(
            f"{mode + '-context':<20}{s['median']:>10.1f}{s['min']:>9.1f}-{s['max']:<8.1f}"
            f"{s['median'] / rq1['agnostic']['median'] - 1:>+12.1%}"
        )
    print("\nRQ2: seconds per 1000 claims (makespan / claims), median [range]")
    rq2 = log["rq2_seconds_per_1000_claims"]
    sizes = sorted({int(s) for mode in rq2.values() for s in mode})
    print(f"{'claims_per_job':<16}{'claims':>8}{'full-context':>26}{'partial-context':>26}")
    for size in sizes:
        cells = []
        for mode in ("full", "partial"):
            s = rq2[mode].get(str(size))
            cells.append(
                f"{s['median']:>7.1f} [{s['min']:.1f}-{s['max']:.1f}] x{len(s['values'])}"
                if s
                else "-"
            )
        print(f"{size:<16}{log['rq2_claims'][str(size)]:>8}{cells[0]:>26}{cells[1]:>26}")
    t = log["targets"]
    lim = log["limit16_items_per_s"]
    print(
        f"\nlimit (bare loop) at 16 claims per job: {lim['limit']['median']:.1f} claims/s; "
        f"full-context {lim['full']['median']:.1f} claims/s"
    )
    print("\ntargets (medians)                         measured   target")
    print(f"full / partial (RQ1)                      {t['full_over_partial']:8.2f}   <= 0.60")
    print(f"full / agnostic (RQ1)                     {t['full_over_agnostic']:8.2f}   <= 0.25")
    print(f"full spread over claims_per_job 8..256    {t['full_spread_8_to_256']:8.1%}   <= 15%")
    print(f"full / limit throughput at 16 per job     {t['full_over_limit_at_16']:8.1%}   >= 85%")
    print(f"\nelapsed: {log['elapsed_s'] / 60:.1f} min")


def draw(log: dict[str, Any], out: Path) -> None:
    """rq1.png (bars with ranges) and rq2.png (seconds per 1000 claims against size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rq1 = log["rq1"]
    modes = ["agnostic", "partial", "full"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    medians = [rq1[m]["median"] for m in modes]
    errors = [
        [rq1[m]["median"] - rq1[m]["min"] for m in modes],
        [rq1[m]["max"] - rq1[m]["median"] for m in modes],
    ]
    ax.bar(
        [f"{m}-context" for m in modes],
        medians,
        yerr=errors,
        capsize=4,
        color=["tab:gray", "tab:orange", "tab:blue"],
    )
    for index, value in enumerate(medians):
        ax.text(index, value, f"{value:.0f} s", ha="center", va="bottom")
    ax.set_ylabel("makespan (s), median and range")
    ax.set_title("RQ1: 128 claims x 4 templates, 32 per job")
    fig.tight_layout()
    fig.savefig(out / "rq1.png", dpi=110)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for mode, color in (("full", "tab:blue"), ("partial", "tab:orange")):
        series = log["rq2_seconds_per_1000_claims"][mode]
        sizes = sorted(int(s) for s in series)
        ax.errorbar(
            sizes,
            [series[str(s)]["median"] for s in sizes],
            yerr=[
                [series[str(s)]["median"] - series[str(s)]["min"] for s in sizes],
                [series[str(s)]["max"] - series[str(s)]["median"] for s in sizes],
            ],
            marker="o",
            capsize=3,
            color=color,
            label=f"{mode}-context",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("claims per job")
    ax.set_ylabel("seconds per 1000 claims")
    ax.set_title("RQ2: batch size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "rq2.png", dpi=110)


if __name__ == "__main__":
    main()
