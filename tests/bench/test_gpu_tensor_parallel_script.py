"""The tensor-parallel GPU script (workflows/bench/gpu_tensor_parallel.py) runs with
torch alone.

The lent GPU machine has torch but no Snakemake, Dask, SQLAlchemy or transformers:
here the script runs in a subprocess in which importing any of them (or this package)
fails, in its small CPU version (gloo, 2 rank processes, one layer of SmolLM2-1.7B's
shape), and its output is checked. Asked for GPUs it lacks, it says so in one line and
exits 0. On a machine with GPUs, run the script itself (see its docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.test_gpu_slots_script import RUNNER
from tests.conftest import REPO

SCRIPT = REPO / "workflows/bench/gpu_tensor_parallel.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The script, with the packages the GPU machine lacks made unimportable."""
    return subprocess.run(
        [sys.executable, "-c", RUNNER, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_quick_cpu_run_needs_only_torch_and_prints_its_tables(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "gpu_tp.json"
    done = run("--cpu", "--quick", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(
        "gpu_tensor_parallel: device cpu (CPU, 1 torch thread per rank; gloo)"
    )
    assert "SmolLM2-1.7B shape with 1 layer(s), random weights; 2 ranks" in lines[0]
    assert lines[1] == "(a) all-reduce, 2 ranks, float32, 5 repeats (us)"
    assert [line.split("|")[0].strip() for line in lines[3:8]] == [
        "128 KB", "256 KB", "512 KB", "1024 KB", "2048 KB"
    ]  # fmt: skip
    assert lines[8].startswith("(b) forward, 2 claims x ")
    assert [int(line.split("|")[0]) for line in lines[10:12]] == [1, 2]
    assert lines[12].startswith("speedup at tensor_parallel 2: ")
    result = json.loads(out.read_text())
    assert [row["bytes"] for row in result["all_reduce"]] == [
        128 << 10,
        256 << 10,
        512 << 10,
        1 << 20,
        2 << 20,
    ]
    assert all(row["median_s"] > 0 and row["p10_s"] <= row["p90_s"] for row in result["all_reduce"])
    one, two = result["forward"]
    # fp32: the split model's log-probabilities are the unsplit one's.
    assert one["max_abs_logprob_diff"] == 0.0 and two["max_abs_logprob_diff"] < 1e-4
    assert one["all_reduce_share"] == 0.0 and 0.0 < two["all_reduce_share"] < 1.0


def test_without_the_gpus_it_needs_it_says_so_in_one_line_and_exits_0() -> None:
    torch = pytest.importorskip("torch")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    done = run("--ranks", str(count + 1))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        f"gpu_tensor_parallel: {count} GPU(s) here, {count + 1} ranks asked for: nothing "
        f"measured (run it with {count + 1} GPUs, fewer --ranks, or --cpu)"
    ]
