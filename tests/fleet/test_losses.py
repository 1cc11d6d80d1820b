"""Losses: their classification and the two budgets, as pure functions and through the
dispatch state machine (stimuli in, commands out; no Dask)."""

from __future__ import annotations

import random
import signal

import pytest

from snakemake_executor_context.cluster.inject import choose_targets
from snakemake_executor_context.dispatch import vocabulary as v
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.keys import attempt_log
from snakemake_executor_context.fleet.losses import Budgets, LossKind, classify
from tests.dispatch.test_dispatch import join, leave, machine, of, ticket


@pytest.mark.parametrize(
    ("facts", "kind", "why"),
    [
        ({"exit_code": -9, "injected": 9}, LossKind.PREEMPTION, "injected SIGKILL"),
        ({"exit_code": -15}, LossKind.PREEMPTION, "SIGTERM from outside"),
        ({"exit_code": -9}, LossKind.CRASH, "SIGKILL of unknown origin"),
        ({"exit_code": -11}, LossKind.CRASH, "SIGSEGV"),
        ({"exit_code": -6}, LossKind.CRASH, "SIGABRT"),
        ({"exit_code": 3}, LossKind.CRASH, "exited by itself with code 3"),
        ({"exit_code": -9, "heartbeat": True}, LossKind.PREEMPTION, "heartbeat"),
        ({"drained": "SIGTERM"}, LossKind.PREEMPTION, "drained (SIGTERM)"),
        ({}, LossKind.PREEMPTION, "no exit code known"),
        ({"expected": True}, LossKind.CLOSED, "closed"),
        ({"expected": True, "exit_code": 0}, LossKind.CLOSED, "closed"),
    ],
)
def test_a_loss_is_classified_from_what_is_known(facts, kind, why):
    cause = classify(**facts)
    assert cause.kind == kind
    assert why in cause.why


def test_the_preemption_budget_defaults_to_snakemakes_preemptible_retries():
    assert Budgets.resolve(None, None, None) == Budgets(preemptions=10, crashes=2)
    assert Budgets.resolve(None, None, 4).preemptions == 4
    assert Budgets.resolve(7, 0, 4) == Budgets(preemptions=7, crashes=0)


def test_each_attempt_keeps_its_own_log():
    base = ".snakemake/context/logs/score/i=1.abcd1234.log"
    assert attempt_log(base, 1) == base
    assert attempt_log(base, 2) == ".snakemake/context/logs/score/i=1.abcd1234.2.log"
    assert len({attempt_log(base, n) for n in range(1, 5)}) == 4


def _crash(dispatch, address, at, code=3):
    return leave(dispatch, address, at=at, name=address[-2:], exit_code=code)


def test_crashes_fail_the_job_after_the_crash_budget_naming_servers_codes_and_logs():
    dispatch = machine(servers=1, budgets=Budgets(preemptions=10, crashes=2))
    made = v.JobTicket(**{**ticket(1).__dict__, "log_path": "logs/score/i=1.x.log"})
    (submit,) = of(dispatch.handle(v.JobReady(made, 0.0)), v.Submit)
    codes = [3, -11, -9]
    for n, code in enumerate(codes):
        join(dispatch, f"tcp://r{n}", at=n)
        out = _crash(dispatch, submit.address, n + 0.5, code)
        (line,) = of(out, v.Log)
        assert line.level == "warning" and "crash" in line.message and "i=1" in line.message
        assert not of(out, v.ReportSuccess)
        if n < len(codes) - 1:
            assert not of(out, v.ReportError), "a crash within the budget is no failure"
            (submit,) = of(out, v.Submit)
    (error,) = of(out, v.ReportError)
    assert "crash budget of 2" in error.message
    assert "--context-crash-budget" in error.message
    for text in ("s0 (exit code 3)", "r0 (killed by SIGSEGV)", "r1 (killed by SIGKILL)"):
        assert text in error.message
    for log in ("logs/score/i=1.x.log", "logs/score/i=1.x.2.log", "logs/score/i=1.x.3.log"):
        assert log in error.message


def test_preemptions_do_not_consume_the_crash_budget():
    dispatch = machine(servers=1, budgets=Budgets(preemptions=3, crashes=0))
    (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    for n in range(3):
        join(dispatch, f"tcp://r{n}", at=n)
        out = leave(dispatch, submit.address, at=n + 0.5, exit_code=-9, injected=9)
        assert not of(out, v.ReportError)
        (submit,) = of(out, v.Submit)
    join(dispatch, "tcp://last", at=9)
    out = leave(dispatch, submit.address, at=9.5, exit_code=-15)
    (error,) = of(out, v.ReportError)
    assert "preemption budget of 3" in error.message


def test_a_closed_server_costs_no_budget_and_says_nothing_when_idle():
    dispatch = machine(servers=2, budgets=Budgets(preemptions=0, crashes=0))
    assert not of(leave(dispatch, "tcp://s1", expected=True), v.Log)
    (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    join(dispatch, "tcp://r", at=11)
    out = leave(dispatch, submit.address, at=12, expected=True)
    assert not of(out, v.ReportError) and of(out, v.Submit)


def test_a_job_lost_with_a_server_not_seen_dead_waits_for_its_lease():
    dispatch = machine(servers=2)
    dispatch.lease_wait = 35.0
    (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    out = leave(dispatch, submit.address, at=10.0, heartbeat=True)
    assert not of(out, v.Submit), "the stopped server may still run it"
    assert not of(dispatch.handle(v.Tick(40.0)), v.Submit)
    assert of(dispatch.handle(v.Tick(45.5)), v.Submit)
    # killed by its nanny after the missed heartbeats, or seen exiting: no wait
    for facts in ({"heartbeat": True, "exit_code": -9}, {"exit_code": -15}):
        dispatch = machine(servers=2)
        dispatch.lease_wait = 35.0
        (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
        assert of(leave(dispatch, submit.address, at=10.0, **facts), v.Submit)
    # lost with nothing known (a node gone from an attached cluster): it waits too
    dispatch = machine(servers=2)
    dispatch.lease_wait = 35.0
    (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    assert not of(leave(dispatch, submit.address, at=10.0), v.Submit)


def test_the_embedded_cluster_waits_for_restarting_servers_instead_of_failing():
    dispatch = machine(servers=1, embedded=True, wait=30.0, planned=1)
    (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    out = leave(dispatch, submit.address, at=1.0, exit_code=-9, injected=9)
    assert not of(out, v.ReportError)
    (line,) = of(out, v.Log)
    assert line.message.endswith("Fleet: 0 of 1 planned servers.")
    assert not of(dispatch.handle(v.JobReady(ticket(2), 1.5)), v.ReportError)
    assert not of(dispatch.handle(v.Tick(5.0)), v.ReportError), "servers are restarting"
    out = join(dispatch, "tcp://back", at=6.0)
    assert len(of(out, v.Submit)) == 1
    # with the whole fleet there, a job no server can run fails at once
    out = dispatch.handle(v.JobReady(ticket(3, gpu=4), 7.0))
    (error,) = of(out, v.ReportError)
    assert "gpu=4" in error.message


def test_a_loss_is_one_console_line_naming_server_cause_and_jobs():
    dispatch = machine(servers=1)
    (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    event = ev.ServerLeft(address=submit.address, name="cpu0", exit_code=-15)
    (line,) = of(dispatch.handle(v.FleetEvent(event, 2.0)), v.Log)
    assert line.message.startswith("Server cpu0 lost (preemption: SIGTERM from outside")
    assert "1 job(s) back to the queue: Rule 'score' (i=1)" in line.message


def test_the_injector_chooses_by_seed_in_turn_or_by_share():
    names = ["cpu0", "cpu1", "cpu2", "cpu3"]
    first = [choose_targets(names, random.Random(5), fraction=0, turn=0, alternate=False)]
    again = [choose_targets(names, random.Random(5), fraction=0, turn=0, alternate=False)]
    assert first == again
    turns = [
        choose_targets(names, random.Random(0), fraction=0, turn=t, alternate=True)
        for t in range(5)
    ]
    assert turns == [["cpu0"], ["cpu1"], ["cpu2"], ["cpu3"], ["cpu0"]]
    assert len(choose_targets(names, random.Random(1), fraction=0.5, turn=0, alternate=False)) == 2


def test_the_hub_classifies_a_loss_with_the_nannys_exit_code_and_an_injection():
    from snakemake_executor_context.cluster.hub import FleetHub

    hub = FleetHub()
    published: list[ev.Event] = []
    hub._publish = published.append  # type: ignore[method-assign]
    hub.log_event(ev.TOPIC, ev.encode([ev.ServerKillInjected(address="tcp://x", signal=9)]))
    FleetHub.exits["tcp://x"] = -signal.SIGKILL
    hub.log_event("all", {"action": "remove-worker", "worker": "tcp://x", "expected": False})
    (left,) = published
    assert isinstance(left, ev.ServerLeft)
    assert left.injected == 9 and left.exit_code == -9
    assert left.reason.startswith("preemption: injected SIGKILL")


def test_a_draining_server_finishes_only_what_fits_its_grace():
    from snakemake_executor_context.fleet.losses import finishes_in_grace

    assert finishes_in_grace(10.0, 4.0, 30.0)
    assert finishes_in_grace(32.0, 4.0, 30.0)  # 28 s left: grace minus 2 s
    assert not finishes_in_grace(33.0, 4.0, 30.0)
    assert not finishes_in_grace(None, 0.0, 30.0), "unknown length: hand back"


def test_only_attempts_that_ran_on_a_lost_server_are_charged():
    from snakemake_executor_context.fleet.losses import ran_there

    class Server:
        slots = 1

    keys = ["a.1", "b.1"]
    assert ran_there(keys, {"a.1": 1.0}, Server()) == {"a.1"}
    assert ran_there(keys, {}, Server()) == {"a.1"}, "a start not reported yet"
    assert ran_there(keys, {"a.1": 1.0}, Server(), running=["b.1"]) == {"b.1"}
    assert ran_there(keys, {}, Server(), running=[]) == set()


def test_gpu_failures_are_told_from_their_text():
    from snakemake_executor_context.server.policy import gpu_failure

    assert gpu_failure("CUDA error: an illegal memory access was encountered") == "fatal"
    assert gpu_failure("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus") == "fatal"
    assert gpu_failure("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == "oom"
    assert gpu_failure("ValueError: bad claim") is None


def test_a_black_hole_is_a_server_failing_a_rule_others_run():
    from snakemake_executor_context.fleet.keys import rule_of
    from snakemake_executor_context.fleet.losses import FailureStreaks

    assert rule_of("my-rule-12-a1-0abc1234.3") == "my-rule"
    streaks = FailureStreaks(k=2)
    disk = "a full or failing disk (OSError EIO)"
    assert streaks.record("r", "bad", ok=False, fault=disk) is None
    assert streaks.record("r", "bad", ok=False, fault=disk) is None, "nobody succeeded"
    assert streaks.record("r", "good", ok=True) is None
    why = streaks.record("r", "bad", ok=False, fault=disk)
    assert why is not None and "last 2 jobs of rule 'r' failed" in why
    assert streaks.record("other", "bad", ok=False, fault=disk) is None


def test_a_black_hole_counts_only_its_servers_faults():
    """10 of 12 jobs of a rule raise the script's own RuntimeError (the same on any
    server): no server is drained. Failures by the server's fault (a full disk) still
    drain it."""
    from snakemake_executor_context.fleet.losses import FailureStreaks

    streaks = FailureStreaks(k=3)
    assert streaks.record("r", "good", ok=True) is None
    assert streaks.record("r", "bad", ok=True) is None
    assert all(streaks.record("r", "bad", ok=False) is None for _ in range(10))
    disk = "a full or failing disk (OSError ENOSPC)"
    assert streaks.record("r", "bad", ok=False, fault=disk) is None
    assert streaks.record("r", "bad", ok=False) is None, "a job's own failure: not counted"
    assert streaks.record("r", "bad", ok=False, fault=disk) is None
    why = streaks.record("r", "bad", ok=False, fault=disk)
    assert why is not None and "last 3 jobs of rule 'r' failed by its fault" in why, why
    assert disk in why


def test_whose_fault_a_failure_is_is_told_from_its_error():
    import errno

    from snakemake_executor_context.errors import ContextExecutorError, ContextLoadError
    from snakemake_executor_context.server.policy import server_fault

    assert server_fault(RuntimeError("bad input 7")) == ""
    assert server_fault(ValueError("no such key")) == ""
    assert server_fault(FileNotFoundError(errno.ENOENT, "gone")) == "", "the job's own path"
    assert server_fault(ContextExecutorError("declared output missing")) == ""
    assert "ENOSPC" in server_fault(OSError(errno.ENOSPC, "No space left on device"))
    assert "EROFS" in server_fault(OSError(errno.EROFS, "Read-only file system"))
    try:
        try:
            raise OSError(errno.EIO, "Input/output error")
        except OSError as io:
            raise RuntimeError("could not save the checkpoint") from io
    except RuntimeError as wrapped:
        assert "EIO" in server_fault(wrapped), "a library's wrap of the disk's error"
    assert "load" in server_fault(ContextLoadError("loader raised"))
    assert "CUDA" in server_fault(RuntimeError("CUDA error: an illegal memory access"))
    assert server_fault(RuntimeError("CUDA out of memory. Tried to allocate")) == ""

    class Odd(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert server_fault(Odd()) == "", "an error whose own __str__ raises"


def test_a_server_that_loses_its_scheduler_for_its_lease_stops_its_jobs():
    """The watchdog thread with stand-ins for the Dask worker and the server: a
    network partition cannot be made here (no root), so the worker's connection is
    a flag the test closes."""
    import threading
    import time
    from types import SimpleNamespace

    from snakemake_executor_context.server.plugin import _hold_lease

    comm = SimpleNamespace(closed=lambda: state["closed"])
    state = {"closed": False}
    worker = SimpleNamespace(
        status=SimpleNamespace(name="running"), batched_stream=SimpleNamespace(comm=comm)
    )
    stopped: list[str] = []
    server = SimpleNamespace(stop_everything=stopped.append)
    threading.Thread(target=_hold_lease, args=(worker, server, 0.4), daemon=True).start()
    time.sleep(0.6)
    assert not stopped, "connected: nothing stops"
    state["closed"] = True
    deadline = time.time() + 3
    while not stopped and time.time() < deadline:
        time.sleep(0.05)
    worker.status.name = "closed"
    assert stopped and "lease" in stopped[0]
