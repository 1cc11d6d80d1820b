"""A rule's part of its jobs' ``snakemake`` objects (the workflow's config, the params
that are not per-job) travels once per run to the scheduler and once to each server,
the job's own part with each job: the real snakemake CLI on the embedded cluster, the
local executor as the reference, and a real SIGKILL of a server between jobs."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import context_run, snakemake
from tests.e2e.test_preemption import _background_run, _signal_busy_server

pytestmark = pytest.mark.slow


def _seen(workdir: Path, count: int) -> list[dict]:
    return [json.loads((workdir / f"out/{i}.json").read_text()) for i in range(count)]


def _without_pid(seen: list[dict]) -> list[dict]:
    return [{k: v for k, v in one.items() if k != "pid"} for one in seen]


def test_a_rules_jobs_on_one_server_see_the_config_and_params_the_local_executor_gives(
    workflow,
):
    """Four jobs on one server: the first brings the rule part to the server, the
    rest find it there; each sees the 1,000 claims, its own label, a param whose items
    are the config's own (the same objects), and none of what the job before changed
    in its objects, exactly as under --executor local."""
    local = workflow("ruleparts", dest="local")
    snakemake(local, "--executor", "local", "--cores", "1").check()
    context = workflow("ruleparts", dest="context")
    context_run(context, "--context-servers", "1").check()
    expected, seen = _seen(local, 4), _seen(context, 4)
    assert _without_pid(seen) == _without_pid(expected)
    assert [one["label"] for one in seen] == [f"claim-{i}" for i in range(4)]
    assert all(one["claims"] == 1000 and one["param_items_are_the_configs"] for one in seen)
    assert not any(one["changed_seen"] for one in seen)
    assert all(one["weights"] == {"support": 2, "refute": -1} for one in seen)
    assert len({one["pid"] for one in seen}) == 1, "one server ran them all"


def test_a_server_killed_between_jobs_is_back_and_runs_the_rest_with_the_rule_part(workflow):
    """SIGKILL the one server while its second job runs: it comes back as a new
    process that never saw the rule part; the killed job and those after it run
    there with the same config and params as those before the kill."""
    workdir = workflow("ruleparts")
    process = _background_run(workdir, "--context-servers", "1", "--config", "count=5", "sleep=1")
    try:
        killed_pid = _signal_busy_server(workdir, signal.SIGKILL, nth=2)
        killed = time.time()
        output, _ = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    seen = _seen(workdir, 5)
    before = [i for i, one in enumerate(seen) if one["pid"] == killed_pid]
    assert len(before) == 1, ("the first job alone ran before the kill", killed_pid, seen)
    after = [i for i in range(5) if i not in before]
    assert all((workdir / f"out/{i}.json").stat().st_mtime > killed for i in after), seen
    for one in seen:
        assert one["claims"] == 1000 and one["param_items_are_the_configs"], one
        assert one["claims_digest"] == seen[0]["claims_digest"], one
        assert one["weights"] == {"support": 2, "refute": -1} and not one["changed_seen"], one
    assert [one["label"] for one in seen] == [f"claim-{i}" for i in range(5)]


def _rule_parts_held(scheduler_file: Path) -> dict:
    from snakemake_executor_context.cluster.connection import ClusterConnection
    from snakemake_executor_context.jobspec import RULE_PARTS

    target = ClusterConnection.attach(address=None, scheduler_file=scheduler_file, timeout=20)
    try:
        return target.client.get_metadata(list(RULE_PARTS), default={})
    finally:
        target.client.close()


def test_runs_on_an_attached_cluster_each_hand_over_their_rule_part_and_drop_it(
    workflow, scheduler_file
):
    """Two runs of the same workflow, one after the other, on servers that outlive
    them (which kept the first run's rule part, of the same digest): both see the
    same config and params, and each run drops its rule parts from the scheduler at
    its end, so the scheduler keeps no run's bytes."""
    attach = ["--context-scheduler-file", str(scheduler_file)]
    first, second = workflow("ruleparts", dest="first"), workflow("ruleparts", dest="second")
    context_run(first, *attach).check()
    context_run(second, *attach).check()
    assert _without_pid(_seen(first, 4)) == _without_pid(_seen(second, 4))
    held = _rule_parts_held(scheduler_file)
    assert len(held) == 2 and all(parts == {} for parts in held.values()), held
