"""GPU check for issue 27: tensor parallelism over NCCL, torch only.

For a machine with ``--ranks`` GPUs (default 2) and torch; Snakemake, Dask,
transformers and this package are not needed. One process per GPU in one NCCL group
(``workflows/llm/tp_gang.py``: spawned ranks, a FileStore in a temporary directory);
the model is ``workflows/llm/tp_llama.py`` (Megatron-style: two all-reduces per layer)
with seeded random weights of a SmolLM2 shape, bf16 (default SmolLM2-1.7B: 32 heads
and key-value heads, so 2, 4 or 8 ranks; SmolLM2-135M splits only over 3).

What it measures:

- all-reduce latency over bf16 messages of 128 KB to 2 MB between the ranks (the
  range where Singhania et al. find NVRAR 1.9-3.6x faster than NCCL): median, 10th
  and 90th percentiles of ``--ar-repeats``, and the bus bandwidth at the median;
- the scoring forward (``--batch`` claims of 60-100 random tokens, left-padded, the
  last position's log-probabilities) at tensor_parallel 1 and ``--ranks``: rank 0's
  median forward time, the share of it inside the all-reduces (timed with the GPU
  synchronised around each, in a second pass, so the first pass is not slowed), and
  the largest log-probability difference to tensor_parallel 1.

    python workflows/bench/gpu_tensor_parallel.py [--ranks 2] [--out gpu_tp.json]
    python workflows/bench/gpu_tensor_parallel.py --cpu --quick    # gloo, what CI runs

With fewer GPUs than ranks it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

LLM = Path(__file__).resolve().parents[2] / "workflows/llm"
sys.path.insert(0, str(LLM))

import tp_shard  # noqa: E402
from tp_gang import LocalGang, RankInfo  # noqa: E402
from tp_llama import SHAPES, check_split  # noqa: E402

SIZES = [128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20]


def claims(batch: int, lengths: tuple[int, int], vocab: int, seed: int) -> tuple[Any, Any]:
    """``batch`` prompts of random token ids, left-padded, and their keep mask."""
    rng = random.Random(seed)
    rows = [[rng.randrange(3, vocab) for _ in range(rng.randint(*lengths))] for _ in range(batch)]
    n = max(map(len, rows))
    ids = torch.zeros(batch, n, dtype=torch.long)
    keep = torch.zeros(batch, n, dtype=torch.bool)
    for row, tokens in enumerate(rows):
        ids[row, n - len(tokens) :] = torch.tensor(tokens)
        keep[row, n - len(tokens) :] = True
    return ids, keep


def forward_times(call: Any, ids: Any, keep: Any, repeats: int) -> dict[str, Any]:
    """Rank 0's forward seconds (untimed all-reduces), then its all-reduce seconds
    per forward (a timed pass), and the log-probabilities."""
    out = call("logprobs", ids, keep)
    for _ in range(2):
        call("logprobs", ids, keep)  # warm-up
    result: dict[str, Any] = {}
    for timed in (False, True):
        call("timing", True, timed)
        for _ in range(repeats):
            call("logprobs", ids, keep)
        ranks = call("stats")
        if timed:
            result["all_reduce_seconds"] = [r["all_reduce_seconds"] for r in ranks]
            result["timed_forward_seconds"] = [r["forward_seconds"] for r in ranks]
        else:
            result["forward_seconds"] = ranks[0]["forward_seconds"]
    call("timing", False)
    result["logprobs"] = out
    return result


def main() -> None:
    """Parse the arguments, measure, print the tables (and write JSON with --out)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU (fp32)")
    parser.add_argument("--quick", action="store_true", help="a small run (seconds)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-1.7b")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (all)")
    parser.add_argument("--batch", type=int, default=None, help="claims per forward (8)")
    parser.add_argument("--repeats", type=int, default=None, help="forwards timed (20)")
    parser.add_argument("--ar-repeats", type=int, default=None, help="all-reduces per size (50)")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = parser.parse_args()
    quick = {"layers": 1, "batch": 2, "repeats": 3, "ar_repeats": 5}
    full = {"layers": None, "batch": 8, "repeats": 20, "ar_repeats": 50}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    gpus = 0 if args.cpu or not torch.cuda.is_available() else torch.cuda.device_count()
    if not args.cpu and gpus < args.ranks:
        print(
            f"gpu_tensor_parallel: {gpus} GPU(s) here, {args.ranks} ranks asked for: nothing "
            f"measured (run it with {args.ranks} GPUs, fewer --ranks, or --cpu)"
        )
        return
    config = SHAPES[args.shape]
    check_split(config, args.ranks)
    layers = args.layers or config.num_hidden_layers
    backend, dtype = ("gloo", "float32") if args.cpu else ("nccl", "bfloat16")
    devices = ["cpu"] * args.ranks if args.cpu else [f"cuda:{i}" for i in range(args.ranks)]
    if args.cpu:
        torch.set_num_threads(1)
    name = "CPU, 1 torch thread per rank" if args.cpu else torch.cuda.get_device_name(0)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"gpu_tensor_parallel: device {devices[0].split(':')[0]} ({name}; {backend}), torch "
        f"{torch.__version__}, {dtype}, {config.name} shape with {layers} layer(s), random "
        f"weights; {args.ranks} ranks; load average {load}"
    )
    kwargs = {"shape": args.shape, "layers": layers, "seed": args.seed}
    ids, keep = claims(args.batch, (16, 32) if args.quick else (60, 100), config.vocab_size, 1)
    # Tensor parallel 1 in this process (no collective), then the gang.
    one = tp_shard.load_random_shard(**kwargs, rank=RankInfo(0, 1, devices[0], backend, 0))
    alone = forward_times(lambda m, *a: getattr(one, m)(*a), ids, keep, args.repeats)
    one.close()
    if not args.cpu:
        torch.cuda.empty_cache()
    loader = f"{LLM}/tp_shard.py:load_random_shard"
    with LocalGang(loader, args.ranks, kwargs, backend=backend, devices=devices) as gang:
        latency = gang.call("all_reduce_latency", SIZES, args.ar_repeats)
        split = forward_times(gang.call, ids, keep, args.repeats)
    k = args.ranks
    print(f"(a) all-reduce, {k} ranks, {dtype}, {args.ar_repeats} repeats (us)")
    print("message | median | p10    | p90    | bus GB/s")
    rows = []
    for size in SIZES:
        times = sorted(latency[size])
        median = statistics.median(times)
        p10, p90 = times[len(times) // 10], times[min(len(times) - 1, (9 * len(times)) // 10)]
        bus = 2 * (k - 1) / k * size / median / 1e9
        rows.append({"bytes": size, "median_s": median, "p10_s": p10, "p90_s": p90, "bus_gbs": bus})
        print(
            f"{size >> 10:4d} KB | {1e6 * median:6.0f} | {1e6 * p10:6.0f} | {1e6 * p90:6.0f} | "
            f"{bus:8.2f}"
        )
    message = args.batch * ids.shape[1] * config.hidden_size * (4 if args.cpu else 2)
    print(
        f"(b) forward, {args.batch} claims x {ids.shape[1]} tokens, median of {args.repeats} "
        f"(an all-reduce carries {message >> 10} KB, {2 * layers} per forward)"
    )
    print("tensor_parallel | forward ms | all-reduce ms | share | max |diff| vs TP1")
    forwards = []
    for tp, result in ((1, alone), (k, split)):
        forward = statistics.median(result["forward_seconds"])
        reduce = statistics.median(result["all_reduce_seconds"][0])
        share = sum(result["all_reduce_seconds"][0]) / sum(result["timed_forward_seconds"][0])
        diff = float((result["logprobs"] - alone["logprobs"]).abs().max())
        forwards.append(
            {
                "tensor_parallel": tp,
                "forward_s": forward,
                "all_reduce_s": reduce,
                "all_reduce_share": share,
                "max_abs_logprob_diff": diff,
            }
        )
        print(
            f"{tp:15d} | {1000 * forward:10.2f} | {1000 * reduce:13.2f} | {100 * share:4.0f}% | "
            f"{diff:.1e}"
        )
    speedup = forwards[0]["forward_s"] / forwards[1]["forward_s"]
    print(f"speedup at tensor_parallel {k}: {speedup:.2f}x")
    if args.out:
        record = {"device": name, "backend": backend, "dtype": dtype, "shape": args.shape}
        record.update({"layers": layers, "ranks": k, "all_reduce": rows, "forward": forwards})
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
