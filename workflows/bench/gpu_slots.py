"""GPU check for issue 14: slots and batching across jobs, torch only.

Runs on a lent GPU machine that has torch but no Snakemake, Dask, SQLAlchemy or
transformers, and no registry: this script imports torch and the standard library,
and loads the project's batcher (``snakemake_executor_context/callmerge.py``, stdlib
only) by its file path. It builds SmolLM2-135M's architecture in plain torch from its
configuration (``llama_torch.py`` beside it, torch only) with seeded random weights:
the same shapes, so the same cost.

What it measures:

- claims/s with 1, 2, 4 and 8 slots (concurrent jobs on one loaded model, in threads,
  admitted by a slot gate), unbatched (each job runs its own forward passes of
  ``--forward-batch`` claims) and batched (the jobs hand their chunks to one batcher,
  which merges them into passes of up to ``forward batch x slots`` claims): 8 jobs of
  256 claims each, the same claims for every configuration; target on a GPU: at least
  2x the 1-slot rate at 4 slots;
- on a GPU, bf16 against fp32: the fraction of claims whose decision (the sign of
  log P(yes) - log P(no)) agrees (target at least 99%).

    python workflows/bench/gpu_slots.py [--out gpu_slots.json]       # on the GPU
    python workflows/bench/gpu_slots.py --cpu --quick                # a small CPU run

Claims are random token ids of 60-100 tokens (seeded), each with one of four pairs of
answer token ids (as different templates have).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_torch import SMOLLM2_135M, TinyLlama, build_model  # noqa: E402

SLOTS = (1, 2, 4, 8)


def load_module(relative: str, name: str) -> Any:
    """A module of the project, loaded by file path (no package imports)."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def load_batching() -> Any:
    """The project's batcher module (``snakemake_executor_context/callmerge.py``)."""
    return load_module("snakemake_executor_context/callmerge.py", "context_batching")


class _Gate:
    """The server's own slot gate (``server/slots/gate.py``): every job of one group and
    one context, at most ``slots`` at once, as a context server admits them."""

    def __init__(self, slots: int) -> None:
        module = load_module("snakemake_executor_context/server/slots/gate.py", "context_slots")
        self._module = module
        self._gate = module.SlotGate(slots)
        self._local = threading.local()

    def __enter__(self) -> None:
        key = f"job-{threading.get_ident()}"
        self._local.key = key
        self._gate.enter(self._module.Entry(key, group=("gpu-check",), identity="smollm2"))

    def __exit__(self, *_: object) -> None:
        self._gate.leave(self._local.key)


def slot_gate(slots: int) -> Any:
    """Admits at most ``slots`` jobs at a time, through the server's own gate."""
    return _Gate(slots)


# ------------------------------------------------------------------------------------
# Claims and scoring.

Claim = tuple[tuple[int, ...], int, int]


def make_claims(n: int, seed: int, vocab: int) -> list[Claim]:
    """``n`` claims: 60-100 random token ids, and one of four answer-id pairs."""
    rng = random.Random(seed)
    answers = [(rng.randrange(vocab), rng.randrange(vocab)) for _ in range(4)]
    claims = []
    for _ in range(n):
        ids = tuple(rng.randrange(3, vocab) for _ in range(rng.randint(60, 100)))
        claims.append((ids, *answers[rng.randrange(4)]))
    return claims


def scorer(model: TinyLlama, device: str) -> Any:
    """A function of a list of claims: log P(yes) - log P(no) after each, one pass."""

    def score(claims: list[Claim]) -> list[float]:
        n = max(len(c[0]) for c in claims)
        ids = torch.zeros(len(claims), n, dtype=torch.long)
        keep = torch.zeros(len(claims), n, dtype=torch.bool)
        for row, (tokens, _, _) in enumerate(claims):
            ids[row, n - len(tokens) :] = torch.tensor(tokens)
            keep[row, n - len(tokens) :] = True
        rows = torch.arange(len(claims))
        yes = torch.tensor([c[1] for c in claims])
        no = torch.tensor([c[2] for c in claims])
        with torch.inference_mode():
            logprobs = model(ids.to(device), keep.to(device)).cpu()
        return (logprobs[rows, yes] - logprobs[rows, no]).tolist()

    return score


def run_jobs(
    score: Any, jobs: list[list[Claim]], slots: int, forward_batch: int, batcher: Any
) -> tuple[float, list[list[float]]]:
    """Every job in its own thread, ``slots`` admitted at a time; each hands its claims
    in chunks of ``forward_batch`` to the batcher (or scores them itself without one).
    Seconds from the start to the last job's end, and every job's scores."""
    gate = slot_gate(slots)
    out: list[list[float]] = [[] for _ in jobs]
    errors: list[BaseException] = []
    call = batcher if batcher is not None else score

    def job(index: int) -> None:
        with gate:
            try:
                claims = jobs[index]
                for start in range(0, len(claims), forward_batch):
                    out[index] += call(claims[start : start + forward_batch])
            except BaseException as error:
                errors.append(error)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(len(jobs))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return seconds, out


def throughput(args: argparse.Namespace, device: str, batching: Any) -> list[dict[str, Any]]:
    """claims/s for every slot count, unbatched and batched."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build_model(args.layers, device, dtype, args.seed)
    score = scorer(model, device)
    claims = make_claims(args.jobs * args.claims_per_job, args.seed, SMOLLM2_135M["vocab_size"])
    jobs = [claims[i :: args.jobs] for i in range(args.jobs)]
    score(claims[: args.forward_batch])  # warm-up (CUDA kernels, allocator)
    rows: list[dict[str, Any]] = []
    reference: list[list[float]] | None = None
    started = time.perf_counter()
    for slots in args.slots:
        for mode in ("unbatched", "batched"):
            if time.perf_counter() - started > args.budget:
                rows.append({"slots": slots, "mode": mode, "skipped": "time budget spent"})
                continue
            batcher = None
            if mode == "batched":
                batcher = batching.batched(score, max_batch=args.forward_batch * slots)
            times, outs = [], []
            for _ in range(args.repeats):
                seconds, out = run_jobs(score, jobs, slots, args.forward_batch, batcher)
                times.append(seconds)
                outs.append(out)
            if reference is None:
                reference = outs[0]
            deviation = max(
                abs(a - b)
                for job_a, job_b in zip(outs[0], reference, strict=True)
                for a, b in zip(job_a, job_b, strict=True)
            )
            seconds = statistics.median(times)
            histogram = batcher.histogram() if batcher is not None else {}
            calls = sum(histogram.values())
            rows.append(
                {
                    "slots": slots,
                    "mode": mode,
                    "max_batch": args.forward_batch * slots if batcher else args.forward_batch,
                    "claims": len(claims),
                    "seconds": seconds,
                    "claims_per_s": len(claims) / seconds,
                    "mean_batch": (
                        sum(k * v for k, v in histogram.items()) / calls
                        if calls
                        else float(args.forward_batch)
                    ),
                    "max_abs_deviation": deviation,
                }
            )
    base = rows[0].get("claims_per_s")
    for row in rows:
        if base and "claims_per_s" in row:
            row["speedup"] = row["claims_per_s"] / base
    return rows


def agreement(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Decisions of bf16 against fp32 on the same weights and claims."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    claims = make_claims(args.agreement_claims, args.seed + 1, SMOLLM2_135M["vocab_size"])
    scores = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = build_model(args.layers, device, dtype, args.seed)
        score = scorer(model, device)
        scores[name] = [
            s
            for start in range(0, len(claims), args.forward_batch)
            for s in score(claims[start : start + args.forward_batch])
        ]
        del model
    same = sum((a > 0) == (b > 0) for a, b in zip(scores["fp32"], scores["bf16"], strict=True))
    spread = statistics.pstdev(scores["fp32"])
    # Random weights put more scores near 0 than a trained model does: also the
    # agreement on claims decided by a margin of at least 5% of the scores' spread.
    clear = [
        (a > 0) == (b > 0)
        for a, b in zip(scores["fp32"], scores["bf16"], strict=True)
        if abs(a) >= 0.05 * spread
    ]
    return {
        "claims": len(claims),
        "agree": same / len(claims),
        "agree_with_margin": sum(clear) / len(clear) if clear else 1.0,
        "claims_with_margin": len(clear),
        "fp32_score_std": spread,
        "max_abs_difference": max(
            abs(a - b) for a, b in zip(scores["fp32"], scores["bf16"], strict=True)
        ),
    }


def main() -> None:
    """Parse the arguments, measure, print the tables (and write JSON with --out)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with CUDA")
    parser.add_argument("--quick", action="store_true", help="a small run (seconds)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (30)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per configuration (8)")
    parser.add_argument("--claims-per-job", type=int, default=None, help="(256)")
    parser.add_argument("--forward-batch", type=int, default=8)
    parser.add_argument("--slots", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--repeats", type=int, default=None, help="median of (3)")
    parser.add_argument("--agreement-claims", type=int, default=1024)
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for throughput")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = parser.parse_args()
    quick = {"layers": 2, "jobs": 4, "claims_per_job": 8, "slots": [1, 2, 4], "repeats": 1}
    full = {"layers": 30, "jobs": 8, "claims_per_job": 256, "slots": list(SLOTS), "repeats": 3}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    cuda = torch.cuda.is_available() and not args.cpu
    device = "cuda" if cuda else "cpu"
    if not cuda:
        torch.set_num_threads(1)
    batching = load_batching()
    name = torch.cuda.get_device_name(0) if cuda else "CPU, 1 torch thread"
    dtype = "bfloat16" if cuda else "float32"
    print(
        f"gpu_slots: device {device} ({name}), torch {torch.__version__}, {dtype}, "
        f"SmolLM2-135M architecture with {args.layers} layers, random weights; "
        f"{args.jobs} jobs x {args.claims_per_job} claims, forward batch {args.forward_batch}; "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    rows = throughput(args, device, batching)
    print("slots | mode      | max batch | claims/s | vs 1 slot | mean batch | max |diff|")
    for row in rows:
        if "skipped" in row:
            print(f"{row['slots']:5d} | {row['mode']:9s} | skipped: {row['skipped']}")
            continue
        print(
            f"{row['slots']:5d} | {row['mode']:9s} | {row['max_batch']:9d} | "
            f"{row['claims_per_s']:8.1f} | {row['speedup']:8.2f}x | {row['mean_batch']:10.1f} | "
            f"{row['max_abs_deviation']:.2e}"
        )
    at4 = [r for r in rows if r["slots"] == 4 and "speedup" in r]
    if at4:
        best = max(at4, key=lambda r: r["speedup"])
        print(f"speedup at 4 slots: {best['speedup']:.2f}x ({best['mode']}; target >= 2x on a GPU)")
    result: dict[str, Any] = {"device": device, "name": name, "rows": rows}
    if cuda:
        agree = agreement(args, device)
        result["agreement"] = agree
        print(
            f"bf16 vs fp32: {agree['claims']} claims, decisions agree on "
            f"{100 * agree['agree']:.2f}% (target >= 99%), {100 * agree['agree_with_margin']:.2f}% "
            f"of the {agree['claims_with_margin']} decided by a margin; max |diff| "
            f"{agree['max_abs_difference']:.3f}, fp32 score std {agree['fp32_score_std']:.3f}"
        )
    else:
        print("bf16 vs fp32: skipped (no CUDA)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    if not all(math.isfinite(r.get("claims_per_s", 0.0)) for r in rows):
        raise SystemExit("gpu_slots: a rate is not finite")


if __name__ == "__main__":
    main()
