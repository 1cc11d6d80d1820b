"""The dispatch state machine, driven directly: stimuli in, commands out (no Dask, no
Snakemake, no clock), in the spirit of distributed's ``WorkerState`` tests."""

from __future__ import annotations

from snakemake_executor_context import ContextDeclarationError, NoServerError
from snakemake_executor_context.executor import vocabulary as v
from snakemake_executor_context.executor.dispatch import FLEET_CHECK_SECONDS, Dispatch
from snakemake_executor_context.fleet import events as ev
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
    learned = v.Learned(address=address, started=1.0, finished=3.0, items=4, reused=(A,))
    return v.AttemptEnded(key, now, ok=ok, cancelled=cancelled, message=message, learned=learned)


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


def test_a_server_lost_between_the_end_and_the_result_reruns_the_job():
    """The event freed the slot, but only a result reports: the job runs again."""
    dispatch = machine(servers=1)
    join(dispatch, "tcp://s1")
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    dispatch.handle(started(first.key, first.address))
    dispatch.handle(finished(first.key, first.address))
    assert dispatch.fleet.servers[first.address].free  # released once, by the event
    out = leave(dispatch, first.address)
    assert of(out, v.Cancel) == [v.Cancel(first.key)]
    assert of(out, v.Submit)[0].key.endswith(".2")
    assert not of(out, v.ReportSuccess)


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


def test_a_task_cancelled_in_dask_unasked_is_an_error():
    dispatch = machine()
    (first,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    out = dispatch.handle(v.AttemptEnded(first.key, 2.0, ok=False, cancelled=True, message="x"))
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
