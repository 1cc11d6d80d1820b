"""What building and loading a context job's ``snakemake`` object costs per job, before
and after the rule part (the config and the rule's shared params pickled once per
rule, its bytes sent once per server), side by side in one run.

Two worker processes, one importing each tree (``--before``, e.g. an untouched copy of
an older commit, and ``--after``, this checkout), each with the same real Snakemake DAG
of ``--jobs`` jobs of one rule whose config holds ``--claims`` claims (a fact-check's),
with two params from the config and a per-job label. Each round, every worker, for
every job: on the executor's side, makes the ``snakemake`` object's bytes (the step of
:meth:`SpecBuilder.context` that does, ``the object``), the whole spec (``the spec``, the
object in it) and pickles the spec as Dask sends it; on the server's side, unpickles
the spec and loads the script's object from it (after: with the rule part in the
server's cache, as it is from the rule's second job on). The rounds alternate between
the workers, so load on the machine falls on both alike. Prints the median over the
rounds of the CPU microseconds per job, the bytes each job's spec carries, and
after/before.

    python workflows/bench/rulepart.py --before /tmp/old [--after .] [--jobs 200]
        [--claims 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SNAKEFILE = textwrap.dedent("""
    from snakemake_executor_context import declare_context

    config.setdefault("claims", [
        {"id": i, "text": f"claim {i}: a sentence of the kind a fact-check checks, "
         f"with its source {i % 97}", "label": ["true", "false", "mixed"][i % 3],
         "sources": [f"https://example.org/{i}", f"https://example.org/{i + 1}"]}
        for i in range(int(config["claim_count"]))
    ])
    config.setdefault("model", "Qwen/Qwen2.5-0.5B-Instruct")
    config.setdefault("batch", 16)
    declare_context(config, "toy", "loader.py:load")

    rule all:
        input: expand("out/{i}.txt", i=range(int(config["count"])))

    rule work:
        output: "out/{i}.txt"
        params:
            model=config["model"],
            batch=config["batch"],
            label=lambda wildcards: f"claim-{wildcards.i}",
        resources: context="toy"
        script: "scripts/work.py"
""")

WORKER = textwrap.dedent("""
    import json, pickle, sys, time
    from pathlib import Path

    from snakemake_executor_context import snakemake_internals as internals
    from snakemake_executor_context.contexts import declarations_from_config
    from snakemake_executor_context.executor.jobbuild import SpecBuilder

    workdir, count, claims = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    dag, _ = internals.workflow_dag(
        workdir / "Snakefile", workdir, {"count": count, "claim_count": claims}, [],
        ["all"], False,
    )
    workflow = dag.workflow
    if workflow.execution_settings is None:  # a dry run's DAG: a run's defaults
        from snakemake.settings.types import ExecutionSettings

        workflow.execution_settings = ExecutionSettings()
    jobs = sorted((j for j in dag.jobs if j.rule.name == "work"), key=lambda j: j.jobid)
    declaration = declarations_from_config(workflow.config)["toy"]
    split = hasattr(SpecBuilder, "_rule_part")  # the tree with rule parts
    if split:
        from snakemake_executor_context.jobspec import RulePart
        from snakemake_executor_context.server import inprocess

    def object_bytes(builder, job):
        # The job's snakemake object as its spec carries it (SpecBuilder.context's step).
        config = internals.workflow_config(workflow)
        scriptdir = str(workdir / "scripts")
        made = internals.script_object(job, config, scriptdir)
        if split:
            return internals.pickle_script_object(made, builder._rule_part(job.rule, config)[0])
        return pickle.dumps(made, protocol=4)

    def sent(spec):
        if split:  # the rule part went to the scheduler with the rule's first job
            spec.rule_part = RulePart(spec.rule_part.digest)
        return pickle.dumps(spec, protocol=5)

    def object_of(spec):
        if split:
            return internals.load_script_object(spec.snakemake_pickle, inprocess._rule_part(spec))
        return internals.load_script_object(spec.snakemake_pickle)

    def cpu_per_job(work, items):
        started = time.process_time()
        for item in items:  # what each job made gone before the next, as on a server
            made = work(item)
        return (time.process_time() - started) / len(items) * 1e6, made

    for line in sys.stdin:
        builder = SpecBuilder(workflow, str(workdir), "bench", lambda job: "", dict)
        spec_cpu, _ = cpu_per_job(
            lambda job: builder.context(job, f"work-{job.jobid}", declaration), jobs
        )
        object_cpu, _ = cpu_per_job(lambda job: object_bytes(builder, job), jobs)
        specs = [builder.context(job, f"work-{job.jobid}", declaration) for job in jobs]
        send_cpu, _ = cpu_per_job(sent, specs)
        wires = [sent(spec) for spec in specs]
        if split:  # the one fetch from the scheduler, before the rule's second job
            part = builder._rule_parts["work"][1]
            inprocess._rule_parts.keep(part.digest, part.data)
        receive_cpu, _ = cpu_per_job(pickle.loads, wires)
        received = [pickle.loads(wire) for wire in wires]
        load_cpu, snakemake = cpu_per_job(object_of, received)
        assert len(snakemake.config["claims"]) == claims and snakemake.params.label
        print(json.dumps({
            "executor: the object": object_cpu,
            "executor: the spec": spec_cpu,
            "executor: spec pickled": send_cpu,
            "server: spec unpickled": receive_cpu,
            "server: the object": load_cpu,
            "bytes per job's spec": sum(map(len, wires)) / len(wires),
        }), flush=True)
""")


def write_workflow(directory: Path) -> None:
    """The bench's workflow: its Snakefile, loader and script."""
    (directory / "scripts").mkdir(parents=True, exist_ok=True)
    (directory / "Snakefile").write_text(SNAKEFILE)
    (directory / "loader.py").write_text("def load():\n    return {}\n")
    (directory / "scripts/work.py").write_text("print(len(snakemake.config['claims']))\n")


def start_worker(tree: Path, workdir: Path, jobs: int, claims: int) -> subprocess.Popen[str]:
    """A worker importing the package from ``tree`` (its root), in the workflow's
    directory."""
    environment = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(workdir), str(jobs), str(claims)],
        cwd=workdir,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def round_of(worker: subprocess.Popen[str]) -> dict[str, float]:
    """One round in that worker: CPU µs per job by side, and bytes per spec."""
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write("go\n")
    worker.stdin.flush()
    return dict(json.loads(worker.stdout.readline()))


def main() -> None:
    """Run the rounds, alternating the two trees, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the older tree's root")
    parser.add_argument("--after", type=Path, default=REPO, help="the newer tree's root")
    parser.add_argument("--jobs", type=int, default=200, help="jobs of the rule")
    parser.add_argument("--claims", type=int, default=1000, help="claims in the config")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rulepart-bench-") as directory:
        workdir = Path(directory)
        write_workflow(workdir)
        workers = {
            side: start_worker(tree, workdir, args.jobs, args.claims)
            for side, tree in (("before", args.before), ("after", args.after))
        }
        rounds: dict[str, list[dict[str, float]]] = {side: [] for side in workers}
        try:
            for _ in range(args.rounds):
                for side, worker in workers.items():
                    rounds[side].append(round_of(worker))
        finally:
            for worker in workers.values():
                assert worker.stdin is not None
                worker.stdin.close()
                worker.wait(timeout=60)
    print(
        f"per job of {args.jobs} of one rule, a config of {args.claims} claims, "
        f"median of {args.rounds} rounds (CPU µs; bytes)"
    )
    print(f"{'':<28}{'before':>12}{'after':>12}{'after/before':>14}")
    for name in rounds["before"][0]:
        median = {side: statistics.median(r[name] for r in rounds[side]) for side in workers}
        ratio = median["after"] / median["before"]
        print(f"{name:<28}{median['before']:>12.1f}{median['after']:>12.1f}{ratio:>14.3f}")


if __name__ == "__main__":
    main()
