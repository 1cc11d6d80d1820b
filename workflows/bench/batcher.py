"""The batcher's added latency on a lone one-item call (issue 14: at most 1 ms p50).

Interleaved: a direct call of a trivial function, then the same call through
:func:`snakemake_executor_context.callmerge.batched` with the default settings (no
wait), many times; prints the p50 and p99 of each and the p50 difference. Nothing
else runs, so every batched call leads its own batch: the cost of the locks, the
request and the bookkeeping, which is what a job pays at low load.

    python workflows/bench/batcher.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from snakemake_executor_context.callmerge import batched


def score(items: list[str]) -> list[int]:
    """A stand-in for a forward pass that costs nothing."""
    return [len(item) for item in items]


def measure(calls: int) -> dict[str, float]:
    """p50 and p99 of a direct and a batched one-item call, in microseconds."""
    wrapped = batched(score)
    direct: list[float] = []
    through: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        score(["claim"])
        direct.append(time.perf_counter() - started)
        started = time.perf_counter()
        wrapped(["claim"])
        through.append(time.perf_counter() - started)

    def pct(values: list[float], q: int) -> float:
        return 1e6 * statistics.quantiles(values, n=100)[q - 1]

    return {
        "direct_p50_us": pct(direct, 50),
        "batched_p50_us": pct(through, 50),
        "direct_p99_us": pct(direct, 99),
        "batched_p99_us": pct(through, 99),
    }


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    numbers = measure(args.calls)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    added = numbers["batched_p50_us"] - numbers["direct_p50_us"]
    print(f"lone one-item call, {args.calls} interleaved calls; load average {load}")
    print(
        f"direct p50 {numbers['direct_p50_us']:.1f} us, p99 {numbers['direct_p99_us']:.1f} us; "
        f"batched p50 {numbers['batched_p50_us']:.1f} us, p99 {numbers['batched_p99_us']:.1f} us"
    )
    print(f"added latency p50: {added:.1f} us (target <= 1000 us)")


if __name__ == "__main__":
    main()
