"""The GPU check script (workflows/bench/gpu_slots.py) runs with torch alone.

The lent GPU machine has torch but no Snakemake, Dask, SQLAlchemy or transformers:
here the script runs in a subprocess in which importing any of them (or this package)
fails, in its small CPU version (2 layers, a few claims), and its output is checked.
The GPU part (bf16 against fp32) skips cleanly without CUDA; on a GPU machine run the
script itself (see its docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "workflows/bench/gpu_slots.py"

#: Runs the script with the packages the GPU machine lacks made unimportable.
RUNNER = """
import runpy, sys
BLOCKED = {"snakemake", "dask", "distributed", "sqlalchemy", "transformers",
           "snakemake_executor_context", "textual"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not on the GPU machine")
        return None
sys.meta_path.insert(0, Block())
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_the_quick_cpu_run_needs_only_torch_and_prints_its_tables(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "gpu_slots.json"
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(SCRIPT), "--cpu", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpu_slots: device cpu"), lines
    assert "SmolLM2-135M architecture with 2 layers" in lines[0]
    assert lines[1].startswith("slots | mode")
    table = [line.split("|") for line in lines[2:8]]
    assert [(int(row[0]), row[1].strip()) for row in table] == [
        (slots, mode) for slots in (1, 2, 4) for mode in ("unbatched", "batched")
    ]
    assert any(line.startswith("speedup at 4 slots: ") for line in lines)
    assert lines[-1] == "bf16 vs fp32: skipped (no CUDA)"
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert all(row["claims_per_s"] > 0 and row["claims"] == 32 for row in rows)
    assert rows[0]["speedup"] == 1.0
    # fp32: every configuration's scores equal the 1-slot unbatched ones (batched
    # passes mix claims of other jobs and other answer ids, left-padded differently).
    assert all(row["max_abs_deviation"] < 1e-4 for row in rows)
    assert {row["max_batch"] for row in rows if row["mode"] == "batched"} == {8, 16, 32}
