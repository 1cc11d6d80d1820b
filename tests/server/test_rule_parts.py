"""A rule part on its way: pickled once beside each job's own part, handed to the
scheduler once per run, fetched once by each server that lacks it (a new or a
restarted one), never another's (real Dask: a local cluster of worker processes)."""

from __future__ import annotations

import hashlib
import os
import pickle
from types import SimpleNamespace

import pytest

from snakemake_executor_context.contexts import ContextDeclaration
from snakemake_executor_context.executor.tasks import Tasks
from snakemake_executor_context.jobspec import RULE_PARTS, ContextJobSpec, RulePart
from snakemake_executor_context.server import inprocess
from snakemake_executor_context.snakemake_internals import (
    load_script_object,
    pickle_script_object,
    rule_shared,
)

CLAIMS = [{"id": i, "text": f"claim {i}", "sources": [i, i + 1]} for i in range(1000)]


def test_a_jobs_own_part_names_the_shared_objects_and_each_load_has_its_own():
    config = {"claims": CLAIMS, "model": "m"}
    weights = {"support": 2}
    rule = SimpleNamespace(params=[CLAIMS, weights, lambda wildcards: 0, "{i}"])
    shared = rule_shared(rule, config)
    job = SimpleNamespace(
        config=config, claims=list(CLAIMS), weights=weights, label="claim-3", resources={}
    )
    own = pickle_script_object(job, shared)
    assert len(own) * 5 < len(pickle.dumps(job, protocol=4)), "the claims stay in the rule part"
    first, second = load_script_object(own, shared.pickled), load_script_object(own, shared.pickled)
    assert first == job and second == job
    assert first.claims[0] is first.config["claims"][0], "shared as in one pickle"
    assert first.weights is not weights
    first.config["claims"][0]["changed"] = True
    assert "changed" not in second.config["claims"][0], "each load its own objects"


def _spec(run_id: str, part: RulePart) -> ContextJobSpec:
    declaration = ContextDeclaration("toy", "loader.py:load", {}, "toy-identity")
    return ContextJobSpec(
        key="work-1-1-abc",
        rule="work",
        jobid=1,
        title="Rule 'work'",
        declaration=declaration,
        workdir=".",
        script_path="scripts/work.py",
        script_source="",
        search_paths=[],
        snakemake_pickle=b"",
        rule_part=part,
        inputs=[],
        outputs=[],
        logs=[],
        benchmark=None,
        benchmark_repeats=1,
        benchmark_extended=False,
        threads=1,
        envvars={},
        latency_wait=0.0,
        log_path="work.log",
        run_id=run_id,
    )


def _fetched_on_the_server(spec: ContextJobSpec) -> tuple[bytes, int]:
    return inprocess._rule_part(spec), os.getpid()


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def test_the_spec_goes_without_the_bytes_and_a_new_or_restarted_server_fetches_them(client):
    data = rule_shared(SimpleNamespace(params=[]), {"claims": CLAIMS}).pickled
    part = RulePart(hashlib.sha256(data).hexdigest(), data)
    tasks = Tasks(SimpleNamespace(client=client))
    first, second = _spec("run-a", part), _spec("run-a", part)
    tasks._publish_rule_parts(first)
    tasks._publish_rule_parts(second)
    assert first.rule_part == second.rule_part == RulePart(part.digest), "the digest only"
    assert client.get_metadata([*RULE_PARTS, "run-a", part.digest]) == data
    fetched, pid = client.submit(_fetched_on_the_server, first, pure=False).result()
    assert fetched == data
    client.restart_workers(list(client.scheduler_info()["workers"]))
    fetched, restarted = client.submit(_fetched_on_the_server, second, pure=False).result()
    assert fetched == data and restarted != pid, "a new process, which fetched it again"

    tasks.forget_rule_parts()
    client.restart_workers(list(client.scheduler_info()["workers"]))
    with pytest.raises(Exception, match=f"holds no rule part {part.digest[:12]} for run run-a"):
        client.submit(_fetched_on_the_server, second, pure=False).result(timeout=60)


def test_a_rule_part_that_is_not_the_digests_is_refused(client):
    data = rule_shared(SimpleNamespace(params=[]), {"claims": CLAIMS[:3]}).pickled
    digest = hashlib.sha256(data).hexdigest()
    client.set_metadata([*RULE_PARTS, "run-b", digest], data + b"stale")
    spec = _spec("run-b", RulePart(digest))
    with pytest.raises(Exception, match="is not the one the job names"):
        client.submit(_fetched_on_the_server, spec, pure=False).result(timeout=60)
