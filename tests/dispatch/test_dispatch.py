"""The dispatch state machine, driven directly: stimuli in, commands out (no Dask, no
Snakemake, no clock), in the spirit of distributed's ``WorkerState`` tests."""

from __future__ import annotations

import dataclasses

import pytest

from snakemake_executor_context import ContextDeclarationError, NoServerError
from snakemake_executor_context.dispatch import vocabulary as v
from snakemake_executor_context.dispatch.machine import FLEET_CHECK_SECONDS, Dispatch
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.outcome import Outcome, ServerIdentity
from snakemake_executor_context.fleet.resources import Requirements, job_resources

RUN = "run-1"
A = "a" * 64
GPU1 = Requirements(gpu=1)


def ticket(n: int, *, identity: str | None = A, priority: int = 0, gpu: int = 1, group=False):
    requirements = Requirements(gpu=gpu)
    label = f"group '{n}'" if group else "rule 'score'"
    return v.JobTicket(
        key=f"score-{n}-a1-0000000{n % 10}",
        label=label,
        title=f"Group '{n}'" if group else f"Rule 'score' (i={n})",
        rule=f"group {n}" if group else "score",
        jobid=str(n),
        kind="context" if identity else "plain",
        requirements=requirements,
        wanted=job_resources(requirements),
        identity=identity,
        context="m" if identity else None,
        priority=priority,
    )


def machine(servers=2, *, slots=1, embedded=False, wait=30.0, budgets=None, planned=0) -> Dispatch:
    dispatch = Dispatch(
        RUN, embedded=embedded, wait_for_server=wait, budgets=budgets, planned=planned
    )
    for i in range(servers):
        join(dispatch, f"tcp://s{i}", slots=slots)
    return dispatch


def join(dispatch: Dispatch, address: str, *, slots: int = 1, at: float = 0.0) -> list:
    event = ev.ServerJoined(
        at=at, address=address, name=address[-2:], slots=slots, resources={"gpu": 1}
    )
    return dispatch.handle(v.FleetEvent(event, at))


def leave(dispatch: Dispatch, address: str, at: float = 10.0, **why) -> list:
    event = ev.ServerLeft(at=at, address=address, reason="lost (handle-worker-cleanup)", **why)
    return dispatch.handle(v.FleetEvent(event, at))


def of(commands, kind):
    return [c for c in commands if isinstance(c, kind)]


def recorded(commands, kind):
    return [c.event for c in of(commands, v.Record) if isinstance(c.event, kind)]


def ended(key, *, ok=True, address="tcp://s0", now=5.0, cancelled=False, message=None):
    server = ServerIdentity("s", "host", 1, address)
    outcome = Outcome(
        key,
        server,
        ok=ok,
        cancelled=cancelled,
        started=1.0,
        finished=3.0,
        items=4,
        reused=(A,),
        context=A,
        gpu_model="h200",
    )
    return v.AttemptEnded(key, now, outcome=outcome, message=message)


def started(key, address, at=1.0):
    return v.FleetEvent(ev.JobStarted(at=at, run_id=RUN, key=key, address=address, context=A), at)


def finished(key, address, at=3.0, run_id=RUN):
    event = ev.JobFinished(
        at=at, run_id=run_id, key=key, address=address, context=A, started=1.0, finished=at
    )
    return v.FleetEvent(event, at)


def test_a_ready_job_is_submitted_with_an_attempt_key_and_recorded():
    dispatch = machine()
    out = dispatch.handle(v.JobReady(ticket(1), 0.0))
    (submit,) = of(out, v.Submit)
    assert submit.key == "score-1-a1-00000001.1" and submit.address in {"tcp://s0", "tcp://s1"}
    (dispatched,) = recorded(out, ev.JobDispatched)
    assert (dispatched.key, dispatched.target, dispatched.reason) == (
        submit.key,
        submit.address,
        "any",
    )
    out = dispatch.handle(ended(submit.key, address=submit.address))
    assert [type(c) for c in out if not isinstance(c, v.Record)] == [v.ReportSuccess]
    (reported,) = recorded(out, ev.JobReported)
    assert (reported.key, reported.outcome) == (submit.key, "ok")


def test_a_server_lost_mid_job_sends_the_job_elsewhere_without_a_report():
    dispatch = machine()
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    dispatch.handle(started(first.key, first.address))
    out = leave(dispatch, first.address)
    assert of(out, v.Cancel) == [v.Cancel(first.key)]
    (again,) = of(out, v.Submit)
    assert again.key.endswith(".2") and again.address != first.address
    assert not of(out, v.ReportError) and not of(out, v.ReportSuccess)


def test_a_job_its_server_said_ended_ok_is_not_run_again_when_the_server_dies_holding_it():
    """The server's JobFinished said ok (its outputs written and checked); the server
    died before the result was fetched: the job succeeded, and is not placed again."""
    dispatch = machine()
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    dispatch.handle(started(first.key, first.address))
    dispatch.handle(finished(first.key, first.address))
    assert dispatch.fleet.servers[first.address].free  # released once, by the event
    out = leave(dispatch, first.address)
    assert not of(out, v.Submit)
    assert of(out, v.Cancel) == [v.Cancel(first.key)]  # its future, held by the dead server
    assert [c.ticket.key for c in of(out, v.ReportSuccess)] == [ticket(1).key]
    (reported,) = recorded(out, ev.JobReported)
    assert (reported.key, reported.outcome) == (first.key, "ok")
    assert not recorded(out, ev.AttemptsLost)
    assert any("said so, then left" in str(e.detail) for e in dispatch.story(first.key))
    assert dispatch.handle(ended(first.key, address=first.address)) == [  # fenced off
        v.Log("debug", f"fenced off the result of given-up attempt {first.key}")
    ]


def test_attempts_a_server_left_with_that_the_hub_did_not_list_are_recorded_lost_by_dispatch():
    """A server killed with its job running, whose loss record (the hub's) lists no
    job: dispatch records the attempt it placed there as lost; a listed one is not
    recorded twice."""
    for listed in (False, True):
        dispatch = machine(servers=1)
        (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
        dispatch.handle(started(first.key, first.address))
        hubs = [ev.LostJob(key=first.key, run_id=RUN).to_wire()] if listed else []
        out = leave(dispatch, first.address, exit_code=-9, lost=hubs)
        if listed:
            assert not recorded(out, ev.AttemptsLost)
            continue
        (lost,) = recorded(out, ev.AttemptsLost)
        assert (lost.run_id, lost.address) == (RUN, first.address)
        assert [(j.key, j.started) for j in lost.lost_jobs()] == [(first.key, 1.0)]
        assert lost.reason == "lost (handle-worker-cleanup)"  # the loss record's own


def test_a_result_after_its_servers_loss_is_fenced_off():
    dispatch = machine()
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    (second,) = of(leave(dispatch, first.address), v.Submit)
    out = dispatch.handle(ended(first.key, address=first.address))
    assert not of(out, v.ReportSuccess) and not of(out, v.ReportError)
    assert not recorded(out, ev.JobReported) and not recorded(out, ev.JobFinished)
    assert "fenced" in of(out, v.Log)[0].message
    out = dispatch.handle(ended(second.key, address=second.address))
    assert len(of(out, v.ReportSuccess)) == 1


def test_a_dropped_finished_event_costs_nothing():
    """No JobFinished from the server: the result frees the slot, reports, and
    records the attempt's end itself."""
    dispatch = machine(servers=1)
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    out = dispatch.handle(v.JobReady(ticket(2), 0.5))
    assert not of(out, v.Submit)  # the only slot is taken
    dispatch.handle(started(first.key, first.address))
    out = dispatch.handle(ended(first.key, address=first.address))
    assert len(of(out, v.ReportSuccess)) == 1
    (end,) = recorded(out, ev.JobFinished)
    assert (end.key, end.items, end.ok) == (first.key, 4, True)
    kinds = [type(c.event) for c in of(out, v.Record)]
    assert kinds.index(ev.JobFinished) < kinds.index(ev.JobReported)
    (second,) = of(out, v.Submit)  # the freed slot is used at once
    assert second.ticket.key == ticket(2).key


def test_a_dropped_result_holds_no_slot_and_is_polled():
    dispatch = machine(servers=1)
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    dispatch.handle(started(first.key, first.address))
    out = dispatch.handle(finished(first.key, first.address, at=3.0))
    assert dispatch.fleet.servers[first.address].free
    assert not of(dispatch.handle(v.Tick(3.0 + FLEET_CHECK_SECONDS / 2)), v.Poll)
    assert of(dispatch.handle(v.Tick(3.0 + FLEET_CHECK_SECONDS)), v.Poll) == [v.Poll(first.key)]
    # When the result does come, the end is not recorded twice.
    out = dispatch.handle(ended(first.key, address=first.address, now=9.0))
    assert len(of(out, v.ReportSuccess)) == 1 and not recorded(out, ev.JobFinished)


def test_each_slot_is_released_exactly_once():
    """A late JobStarted or JobFinished of an attempt that has ended never takes a
    slot again (the event and the result race: either order)."""
    dispatch = machine(servers=1)
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    dispatch.handle(ended(first.key, address=first.address))
    dispatch.handle(started(first.key, first.address))
    dispatch.handle(finished(first.key, first.address))
    server = dispatch.fleet.servers[first.address]
    assert server.free and server.busy == 0
    # The server's echo of the job is not measured a second time.
    assert dispatch.fleet.measure.job[(A, "cpu")].count == 1


def test_an_unrunnable_job_fails_at_once_on_the_embedded_cluster():
    dispatch = machine(embedded=True)
    out = dispatch.handle(v.JobReady(ticket(1, gpu=2), 0.0))
    (error,) = of(out, v.ReportError)
    assert error.message.startswith("No context server can run rule 'score': gpu=2")
    assert isinstance(error.error, NoServerError)
    assert recorded(out, ev.JobReported)[0].outcome == "unrunnable"


def test_an_unrunnable_group_names_the_group():
    dispatch = machine(embedded=True)
    (error,) = of(dispatch.handle(v.JobReady(ticket(0, gpu=2, group=True), 0.0)), v.ReportError)
    assert error.message.startswith("No context server can run group '0': gpu=2")


def test_an_unrunnable_group_of_context_jobs_names_its_widest_member():
    """A group of context jobs needs one server of its widest member's GPUs: the one
    line says so, and names the member's rule, whose resources the fix changes."""
    members = tuple(
        dataclasses.replace(ticket(n, gpu=gpu), label=f"rule '{rule}'")
        for n, (rule, gpu) in enumerate([("small", 1), ("wide", 2)], 1)
    )
    group = dataclasses.replace(ticket(0, gpu=2, group=True), kind="group", members=members)
    (error,) = of(machine(embedded=True).handle(v.JobReady(group, 0.0)), v.ReportError)
    assert error.message.startswith(
        "No context server can run rule 'wide' in group '0' (a group's members run on one "
        "server, which needs its widest member's resources, not their sum): gpu=2 but the "
        "servers have at most 1"
    ), error.message
    assert "--set-resources wide:" in error.message


def test_an_unrunnable_job_waits_for_servers_on_an_attached_cluster():
    dispatch = machine(wait=30.0)
    assert not of(dispatch.handle(v.JobReady(ticket(1, gpu=2), 0.0)), v.ReportError)
    assert not of(dispatch.handle(v.Tick(29.0)), v.ReportError)
    (error,) = of(dispatch.handle(v.Tick(31.0)), v.ReportError)
    assert "after waiting 31 s" in error.message
    # A server that fits, joining in time, takes it instead.
    dispatch = machine(wait=30.0)
    dispatch.handle(v.JobReady(ticket(2, gpu=2), 0.0))
    event = ev.ServerJoined(at=5.0, address="tcp://big", resources={"gpu": 2})
    (submit,) = of(dispatch.handle(v.FleetEvent(event, 5.0)), v.Submit)
    assert submit.address == "tcp://big"
    assert not of(dispatch.handle(v.Tick(40.0)), v.ReportError)


def test_cancel_drops_queued_jobs_and_stops_running_ones():
    dispatch = machine(servers=1)
    (running,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    dispatch.handle(v.JobReady(ticket(2), 0.0))
    assert dispatch.queued == 1
    out = dispatch.handle(v.CancelAll(1.0))
    assert out == [v.StopRunning((running.key,))] and dispatch.queued == 0
    out = dispatch.handle(ended(running.key, ok=False, cancelled=True, address=running.address))
    assert not of(out, v.ReportError) and not of(out, v.Submit)
    assert recorded(out, ev.JobReported)[0].outcome == "cancelled"


def _cancelled_while_running(servers: int = 2):
    dispatch = machine(servers=servers)
    (running,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    dispatch.handle(started(running.key, running.address, at=1.0))
    assert dispatch.handle(v.CancelAll(2.0)) == [v.StopRunning((running.key,))]
    return dispatch, running


def _ended_once_cancelled(out, key, *, finished: float) -> None:
    """One cancelled report, and the attempt's end recorded from its start (no
    server sealed it), on the server the catalog has it on (no address)."""
    assert not of(out, v.Submit) and not of(out, v.ReportError)
    (reported,) = recorded(out, ev.JobReported)
    assert (reported.key, reported.outcome) == (key, "cancelled")
    (end,) = recorded(out, ev.JobFinished)
    assert (end.key, end.cancelled, end.ok, end.address) == (key, True, False, "")
    assert (end.started, end.finished) == (1.0, finished)


def test_a_cancelled_job_whose_server_leaves_while_it_is_stopped_ends_there_once():
    """A server restarted because its job (a hung load) did not stop: the job was
    placed again on the next server (and its load ran on after the run), the run
    recorded as finished. Now it ends cancelled, once, and the run is interrupted."""
    dispatch, running = _cancelled_while_running()
    out = leave(dispatch, running.address, at=12.0)
    _ended_once_cancelled(out, running.key, finished=12.0)
    assert dispatch.queued == 0
    late = dispatch.handle(v.AttemptEnded(running.key, 13.0, dask_cancelled=True))
    assert not recorded(late, ev.JobReported) and not recorded(late, ev.JobFinished)
    end = dispatch.run_end()
    assert (end.run_id, end.ok, end.interrupted) == (RUN, False, True)


def test_a_cancelled_attempt_no_server_ended_is_recorded_from_its_start():
    """The embedded cluster killed on Ctrl-C: the task is cancelled in Dask and no
    server says the attempt ended (it stayed 'running' in the catalog)."""
    dispatch, running = _cancelled_while_running()
    out = dispatch.handle(v.AttemptEnded(running.key, 3.5, message="x", dask_cancelled=True))
    _ended_once_cancelled(out, running.key, finished=3.5)
    # An attempt whose cancellation never comes back ends once it is stopped.
    dispatch, running = _cancelled_while_running()
    _ended_once_cancelled(
        dispatch.handle(v.Stopped((running.key,), 4.0)), running.key, finished=4.0
    )
    late = dispatch.handle(v.AttemptEnded(running.key, 5.0, dask_cancelled=True))
    assert not recorded(late, ev.JobReported) and not recorded(late, ev.JobFinished)
    assert not machine().run_end().interrupted and machine().run_end().ok


def test_a_task_cancelled_in_dask_unasked_is_an_error():
    dispatch = machine()
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    out = dispatch.handle(v.AttemptEnded(first.key, 2.0, message="x", dask_cancelled=True))
    assert of(out, v.ReportError)[0].message == "x"


def test_jobs_go_out_in_snakemakes_priority_order():
    dispatch = machine(servers=1)
    (first,) = of(dispatch.handle(v.JobReady(ticket(1, identity=None), 0.0)), v.Submit)
    dispatch.handle(v.JobReady(ticket(2, identity=None, priority=1), 0.1))
    dispatch.handle(v.JobReady(ticket(3, identity=None, priority=5), 0.2))
    dispatch.handle(v.JobReady(ticket(4, identity=None, priority=5), 0.3))
    order = []
    key = first.key
    for now in (1.0, 2.0, 3.0):
        (submit,) = of(dispatch.handle(ended(key, now=now)), v.Submit)
        order.append(submit.ticket.jobid)
        key = submit.key
    assert order == ["3", "4", "2"]


def test_a_server_with_slots_runs_that_many_jobs_at_once():
    dispatch = machine(servers=1, slots=3)
    # Once a job of the context has been measured (the server knows its working
    # memory then): three at once.
    dispatch.fleet.measure.add_job(A, "cpu", 1.0)
    submits = [of(dispatch.handle(v.JobReady(ticket(i), 0.0)), v.Submit) for i in range(4)]
    assert [len(s) for s in submits] == [1, 1, 1, 0]


def test_a_server_offers_an_unmeasured_context_one_slot():
    """Until a job of a context has been measured, its server runs one of its jobs at
    a time (slots.py): placement does not pile more onto it."""
    dispatch = machine(servers=1, slots=3)
    submits = [of(dispatch.handle(v.JobReady(ticket(i), 0.0)), v.Submit) for i in range(3)]
    assert [len(s) for s in submits] == [1, 0, 0]


def test_without_a_hub_the_workers_list_is_the_membership():
    dispatch = machine(servers=2)
    dispatch.hub = False
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    others = {
        a: {"name": a, "resources": {"gpu": 1}, "slots": 1}
        for a in ("tcp://s0", "tcp://s1", "tcp://n")
    }
    others.pop(first.address)
    out = dispatch.handle(v.ServersPolled(others, 2.0))
    assert sorted(dispatch.fleet.servers) == sorted(others)
    assert of(out, v.Cancel) == [v.Cancel(first.key)] and of(out, v.Submit)


def test_with_a_hub_a_poll_only_checks():
    dispatch = machine(servers=2)
    out = dispatch.handle(
        v.ServersPolled({"tcp://s0": {"name": "s0", "resources": {}, "slots": 1}}, 2.0)
    )
    assert sorted(dispatch.fleet.servers) == ["tcp://s0", "tcp://s1"]
    assert "tcp://s1" in of(out, v.Log)[0].message


def test_events_of_other_runs_feed_the_fleet_state():
    dispatch = machine(servers=1)
    dispatch.handle(
        v.FleetEvent(
            ev.JobStarted(at=1.0, run_id="other", key="k", address="tcp://s0", context=A), 1.0
        )
    )
    assert not dispatch.fleet.servers["tcp://s0"].free
    assert not of(dispatch.handle(v.JobReady(ticket(1), 1.5)), v.Submit)
    out = dispatch.handle(finished("k", "tcp://s0", at=2.0, run_id="other"))
    assert of(out, v.Submit) and dispatch.fleet.measure.job[(A, "cpu")].count == 1


def test_an_invalid_job_is_reported_at_once():
    dispatch = machine()
    invalid = ContextDeclarationError("Rule 'score' uses context 'x'")
    out = dispatch.handle(v.JobReady(ticket(1), 0.0, error=invalid))
    assert of(out, v.ReportError)[0].message == "Rule 'score' uses context 'x'"
    assert of(out, v.ReportError)[0].error is invalid
    assert recorded(out, ev.JobReported)[0].outcome == "invalid"
    assert dispatch.failures == 1


def test_without_a_plan_the_queue_is_the_demand():
    """Snakemake's DAG is not part of the plugin interface: without it, placement
    weighs only the jobs the executor holds (so 4 queued jobs of 1 s never pay for a
    5 s load), and with it the run's remaining jobs (60 do)."""
    for plan, loads in ((None, 0), ({str(i): A for i in range(60)}, 1)):
        dispatch = machine(servers=2)
        if plan is not None:
            dispatch.handle(v.DagPlanned(plan, 0.0))
        (first,) = of(dispatch.handle(v.JobReady(ticket(0), 0.0)), v.Submit)
        dispatch.fleet.measure.add_job(A, "cpu", 1.0)
        dispatch.fleet.measure.add_load(A, "cpu", first.address, 5.0)
        out = []
        for n in range(1, 5):
            out += dispatch.handle(v.JobReady(ticket(n), 1.0))
        cold = [c for c in of(out, v.Submit) if c.address != first.address]
        assert len(cold) == loads, (plan is not None, cold)


def test_a_conversion_asks_the_caches_again():
    dispatch = machine()
    event = ev.ContextReady(
        at=1.0, address="tcp://s0", identity=A, load_seconds=11.0, conversions=1
    )
    assert of(dispatch.handle(v.FleetEvent(event, 1.0)), v.ProbeCaches)
    dispatch.handle(v.CachesProbed({"tcp://s1": (A,)}, 2.0))
    assert A in dispatch.fleet.servers["tcp://s1"].cached
    plain = ev.ContextReady(at=3.0, address="tcp://s1", identity=A, load_seconds=1.0)
    assert not of(dispatch.handle(v.FleetEvent(plain, 3.0)), v.ProbeCaches)


def test_a_server_that_joins_is_asked_what_its_disk_caches():
    # A pilot joining a pool may have weights staged on its node-local disk.
    dispatch = machine(servers=1)
    assert of(join(dispatch, "tcp://s9", at=4.0), v.ProbeCaches)
    dispatch.handle(v.CachesProbed({"tcp://s9": (A,)}, 5.0))
    assert A in dispatch.fleet.servers["tcp://s9"].cached


def test_a_job_no_registered_pilot_can_run_fails_at_the_next_fleet_check():
    """A pool of one untyped kind asked for 1 GPU a pilot; the pilot that registers
    advertises none (no GPU seen on its node): the gpu=1 job fails at the next check
    instead of waiting for the batch queue forever."""
    from snakemake_executor_context.fleet.pilotkinds import PilotKinds

    pool = PilotKinds.from_summaries([{"gpu_type": None, "gpus": 1, "memory_bytes": 2**30}])
    dispatch = Dispatch(RUN, embedded=False, wait_for_server=float("inf"), pool=pool)
    out = dispatch.handle(v.JobReady(ticket(1), 0.0))
    out += dispatch.handle(v.Tick(FLEET_CHECK_SECONDS))
    assert not of(out, v.ReportError), "nothing registered yet: it waits"
    pilot = ev.ServerJoined(at=3.0, address="tcp://p0", name="pilot-slurm-0", resources={})
    out = dispatch.handle(v.FleetEvent(pilot, 3.0))
    out += dispatch.handle(v.Tick(2 * FLEET_CHECK_SECONDS))
    (error,) = of(out, v.ReportError)
    assert error.message.startswith("Rule 'score' asks for gpu=1, which no pilot of the pool")
    assert "pilot-slurm-0 registered offering gpu=0" in error.message


def test_a_job_that_fits_a_kind_not_registered_yet_waits():
    from snakemake_executor_context.fleet.pilotkinds import PilotKinds

    kinds = [{"gpu_type": t, "gpus": 1, "memory_bytes": 2**30} for t in ("fakea", "fakeb")]
    dispatch = Dispatch(
        RUN, embedded=False, wait_for_server=float("inf"), pool=PilotKinds.from_summaries(kinds)
    )
    dispatch.handle(v.JobReady(ticket(1), 0.0))
    pilot = ev.ServerJoined(at=1.0, address="tcp://p0", name="pilot-fakea-0", resources={})
    out = dispatch.handle(v.FleetEvent(pilot, 1.0))
    out += dispatch.handle(v.Tick(10.0))
    assert not of(out, v.ReportError), "fakeb's pilots may still offer a GPU"


def test_a_lost_scheduler_fails_every_job_once_and_records_the_servers():
    dispatch = machine(2)
    out = dispatch.handle(v.JobReady(ticket(1), 0.0))
    out += dispatch.handle(v.JobReady(ticket(2), 0.0))
    out += dispatch.handle(v.JobReady(ticket(3), 0.0))
    submitted = {s.key: s.address for s in of(out, v.Submit)}
    assert 1 <= len(submitted) < 3, "some are in flight, some queued"
    first = next(iter(submitted))
    dispatch.handle(started(first, submitted[first]))
    out = dispatch.handle(v.SchedulerLost("its process was killed by SIGKILL", 5.0))
    (line,) = [c.message for c in of(out, v.Log)]
    assert line == (
        "Context executor: the cluster's scheduler died: its process was killed by SIGKILL."
    )
    assert {c.key for c in of(out, v.Cancel)} == set(submitted)
    assert len(of(out, v.ReportError)) == 3
    left = recorded(out, ev.ServerLeft)
    assert sorted(e.address for e in left) == ["tcp://s0", "tcp://s1"]
    assert sorted(job["key"] for e in left for job in e.lost) == sorted(submitted)
    # A job ready afterwards fails at once; results that come late are fenced off.
    out = dispatch.handle(v.JobReady(ticket(4), 6.0))
    (error,) = of(out, v.ReportError)
    assert "the cluster's scheduler died" in error.message
    assert not of(dispatch.handle(ended(first, now=7.0)), v.ReportSuccess)


def test_sigterm_ends_the_queued_jobs_and_lets_the_running_ones_finish():
    dispatch = machine(1)
    out = dispatch.handle(v.JobReady(ticket(1), 0.0))
    out += dispatch.handle(v.JobReady(ticket(2), 0.0))
    (running,) = [s.key for s in of(out, v.Submit)]
    out = dispatch.handle(v.StopQueued("Snakemake was asked to stop (SIGTERM)", 1.0))
    (error,) = of(out, v.ReportError)
    assert error.ticket.key == ticket(2).key and "not started" in error.message
    assert not of(out, v.Cancel) and dispatch.queued == 0
    assert of(dispatch.handle(ended(running, now=2.0)), v.ReportSuccess)


def test_a_pool_that_cannot_submit_fails_the_queued_jobs_in_one_line():
    """The pool's submit command failed: no job waiting for a pilot would start (the
    run waited in silence); the queued ones fail, the running ones finish."""
    dispatch = machine(1)
    out = dispatch.handle(v.JobReady(ticket(1), 0.0))
    out += dispatch.handle(v.JobReady(ticket(2), 0.0))
    (running,) = [s.key for s in of(out, v.Submit)]
    why = "sbatch failed (exit 1): sbatch: error: Invalid account"
    out = dispatch.handle(v.PoolFailed(why, 1.0))
    (line,) = [c.message for c in of(out, v.Log)]
    assert line.startswith(f"Context executor: the pilots cannot be submitted: {why}. Fix:")
    (error,) = of(out, v.ReportError)
    assert error.ticket.key == ticket(2).key and why in error.message
    assert not of(out, v.Cancel) and dispatch.queued == 0
    assert not of(dispatch.handle(v.PoolFailed(why, 1.5)), v.Log)  # said once
    assert why in of(dispatch.handle(v.JobReady(ticket(3), 2.0)), v.ReportError)[0].message
    assert of(dispatch.handle(ended(running, now=2.0)), v.ReportSuccess)
    assert not dispatch.run_end().ok and not dispatch.interrupted


def test_every_command_carries_its_stimulus_and_the_story_tells_a_loss():
    """distributed's worker state machine keeps a stimulus_id on every instruction and
    answers story(key): so does dispatch, and the loss's budget is in the story."""
    dispatch = machine(budgets=None)
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    assert first.stimulus.startswith("job-ready-")
    dispatch.handle(started(first.key, first.address))
    out = leave(dispatch, first.address, exit_code=-9, injected=9)
    assert {c.stimulus for c in out} == {out[0].stimulus}
    assert out[0].stimulus.startswith("fleet-server-left-")
    lost, requeued = recorded(out, ev.JobStory)
    assert (lost.what, lost.key, lost.stimulus) == ("lost", first.key, out[0].stimulus)
    assert "charged to the preemption budget (1 of 10)" in lost.detail
    assert requeued.what == "requeued" and requeued.key == ticket(1).key
    (again,) = of(out, v.Submit)
    (redispatched,) = recorded(out, ev.JobDispatched)
    assert redispatched.stimulus == out[0].stimulus and redispatched.log == ""
    dispatch.handle(ended(again.key, address=again.address, now=12.0))
    story = dispatch.story(again.key)
    assert [e.what for e in story] == [
        "ready",
        "placed",
        "lost",
        "requeued",
        "placed",
        "ended",
        "reported",
    ]
    assert story == dispatch.story(ticket(1).key) == dispatch.story(first.key)
    assert story[2].attempt == first.key and story[4].attempt == again.key
    assert "preemption" in story[2].line() and "stimulus fleet-server-left" in story[2].line()


def test_the_adapter_refuses_a_command_nothing_carries_out():
    """A command dispatch emits that the adapter does not know fails loudly, never
    passes for a report to Snakemake (the adapter's state is not needed to refuse)."""
    from dataclasses import dataclass

    from snakemake_executor_context.executor.adapter import Executor

    @dataclass(frozen=True)
    class MadeUp:
        key: str

    adapter = Executor.__new__(Executor)  # no run: _execute reads nothing before refusing
    with pytest.raises(TypeError, match="a command of dispatch that nothing carries out"):
        adapter._execute([MadeUp("use-1-a1")])


def test_cache_probes_run_in_the_background_one_at_a_time_and_coalesce():
    """Asked while a probe runs (a server joined, a conversion filled a cache), the
    probes run once more after it, not once per ask; the asker never waits."""
    import threading
    import time

    from snakemake_executor_context.executor.loop import CacheProbes

    release, calls, answers = threading.Event(), [], []

    def probe():
        calls.append(time.monotonic())
        release.wait(10)
        return {"tcp://s0": ("a" * 64,)}

    probes = CacheProbes(probe, answers.append)
    started = time.monotonic()
    for _ in range(3):
        probes.ask()
    assert time.monotonic() - started < 1.0  # nothing waited for the probe
    release.set()
    deadline = time.monotonic() + 10
    while len(answers) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(calls) == 2 and [a.found for a in answers] == [{"tcp://s0": ("a" * 64,)}] * 2


def test_a_groups_members_are_recorded_from_its_result_and_leave_the_demand():
    """A group of two context jobs is one attempt; its result records each member as
    a job of its own (placed with the group, its end, its report), measures each, and
    takes both members out of the run's demand. A group lost with its server records
    no member: its rerun records each once."""
    members = tuple(
        v.JobTicket(
            key=f"score-{n}-a1-0000000{n}",
            label="rule 'score'",
            title=f"Rule 'score' (i={n})",
            rule="score",
            jobid=str(n),
            kind="context",
            identity=A,
            context="m",
        )
        for n in (1, 2)
    )
    group = v.JobTicket(
        key="g-9-a1-00000009",
        label="group 'g'",
        title="Group 'g'",
        rule="group g",
        jobid="9",
        kind="group",
        requirements=GPU1,
        wanted=job_resources(GPU1),
        identity=A,
        context="m",
        members=members,
    )
    dispatch = machine()
    dispatch.handle(v.DagPlanned({"1": A, "2": A, "3": A}, 0.0))
    (first,) = of(dispatch.handle(v.JobReady(group, 0.0)), v.Submit)
    assert dispatch.demand.counts(()) == {A: 3}
    dispatch.handle(started(first.key, first.address))
    out = leave(dispatch, first.address)
    assert not recorded(out, ev.JobReported)
    (again,) = of(out, v.Submit)
    server = ServerIdentity("s", "host", 1, again.address)
    outcomes = [
        Outcome(f"{m.key}.2", server, ok=True, started=1.0, finished=1.0 + n, context=A)
        for n, m in enumerate(members, 1)
    ]
    whole = Outcome(again.key, server, ok=True, started=1.0, finished=4.0)
    ended_group = v.AttemptEnded(
        again.key, 5.0, outcome=whole, members=tuple((o, None) for o in outcomes)
    )
    out = dispatch.handle(ended_group)
    assert [type(c) for c in out if not isinstance(c, v.Record)] == [v.ReportSuccess]
    dispatched = recorded(out, ev.JobDispatched)
    assert [(d.key, d.jobid, d.reason, d.target) for d in dispatched] == [
        (f"{m.key}.2", m.jobid, "group", again.address) for m in members
    ]
    reported = recorded(out, ev.JobReported)
    assert sorted((r.key, r.outcome) for r in reported) == [
        (again.key, "ok"),
        (f"{members[0].key}.2", "ok"),
        (f"{members[1].key}.2", "ok"),
    ]
    assert dispatch.demand.counts(()) == {A: 1}
    assert dispatch.fleet.measure.job_seconds(A, "cpu") == pytest.approx(1.5)
